//! Payload rendering (SPEC §3). Filled in by the box-table work.
