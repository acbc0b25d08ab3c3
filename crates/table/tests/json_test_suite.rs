//! nst/JSONTestSuite's parsing tests (vendored in `tests/data/JSONTestSuite`,
//! MIT) against the projection's scanner:
//! - every `y_` file is valid JSON for [`projection::validate`], and the
//!   projector answers it with a batch or "not an object or array", never
//!   "invalid json";
//! - every `n_` file is refused as invalid JSON, with an offset within it,
//!   by `validate` and by the projector;
//! - every `i_` file (implementation-defined) gets serde_json's verdict;
//! - no file makes anything panic, in any body format or key source.

use pollbox_table::arena::Arena;
use pollbox_table::plan::Plan;
use pollbox_table::projection::{self, BodyError, BodyFormat, KeySource, Projector};
use std::path::PathBuf;
use std::sync::Arc;

fn files() -> Vec<(String, Vec<u8>)> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/JSONTestSuite/test_parsing");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("directory entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("UTF-8 file name")
                .to_owned();
            let bytes = std::fs::read(&path).expect("readable test file");
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}

fn is_invalid_json(e: &BodyError, len: usize) -> bool {
    matches!(e, BodyError::InvalidJson { at, what } if *at <= len && !what.is_empty())
}

#[test]
fn json_test_suite_parsing() {
    let files = files();
    let count = |p: &str| files.iter().filter(|(n, _)| n.starts_with(p)).count();
    // The whole suite is here: a missing file would shrink what is checked.
    assert_eq!(
        (count("y_"), count("n_"), count("i_")),
        (95, 188, 35),
        "vendored suite incomplete"
    );
    let mut projector = Projector::new(Arc::new(Plan::default_plan()));
    let mut arena = Arena::new(1 << 20, 64 << 20);
    let mut wrong = Vec::new();
    for (name, bytes) in &files {
        let verdict = projection::validate(bytes);
        let ok = match &name[..2] {
            "y_" => verdict.is_ok(),
            "n_" => verdict
                .as_ref()
                .is_err_and(|e| is_invalid_json(e, bytes.len())),
            _ => verdict.is_ok() == serde_json::from_slice::<serde_json::Value>(bytes).is_ok(),
        };
        if !ok {
            wrong.push(format!("{name}: validate says {verdict:?}"));
        }
        for format in [BodyFormat::Json, BodyFormat::Ndjson] {
            for keys in [KeySource::Body, KeySource::Path] {
                let got = projector.project(arena.bump(), bytes, format, keys);
                if format != BodyFormat::Json {
                    continue; // NDJSON reads lines: only "no panic" holds
                }
                let agrees = match (&got, &verdict) {
                    (Ok(_) | Err(BodyError::NotObjectOrArray), Ok(())) => true,
                    (Err(e), Err(_)) => is_invalid_json(e, bytes.len()),
                    _ => false,
                };
                if !agrees {
                    wrong.push(format!(
                        "{name}: project({keys:?}) says {:?}, validate {verdict:?}",
                        got.map(|b| b.shape)
                    ));
                }
            }
            arena.reset();
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
