//! The snapshot's view of the table: [`BoxTable::for_each`] walks every live
//! box in batches under each shard's mutex, and [`BoxTable::restore`] puts a
//! walked box back (checking it against the current configuration).

use super::record::Payload;
use super::reduce::Scratch;
use super::update::new_words;
use super::*;

/// Why [`BoxTable::restore`] refused a box (a snapshot that does not fit the
/// current configuration).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RestoreError {
    #[error("empty key")]
    EmptyKey,
    #[error("key longer than max_key_bytes ({max})")]
    KeyTooLong { max: usize },
    #[error("version 0 (versions start at 1)")]
    ZeroVersion,
    #[error("{found} field states for {expected} configured fields")]
    FieldCount { expected: usize, found: usize },
    #[error("field {field}: stored state does not fit its configured type")]
    WrongType { field: String },
    #[error("payload over max_payload_bytes ({max})")]
    PayloadTooLarge { max: usize },
    #[error("more boxes than max_boxes ({max})")]
    TooManyBoxes { max: usize },
    #[error("the box is already present")]
    Duplicate,
}

impl BoxTable {
    /// Call `f(key, version, idle_s, state)` for every box (snapshots):
    /// `idle_s` is how long, at `now_ms`, the box has accepted no message (0
    /// without a ttl, where it is not kept). Each box is seen whole (a seqlock
    /// read of its record), but boxes created, updated or removed during the
    /// walk may or may not be seen.
    ///
    /// Each shard is read from its end down (`changes.rs`): a box present
    /// for the whole walk is seen at least once (at worst twice).
    ///
    /// `f` runs with no lock held: the records of up to [`WALK_BATCH`] slots are
    /// copied under the shard's mutex, which is let go, and only then are
    /// they decoded and handed to `f` (which writes a file). The mutex is so
    /// held for the time of a few small copies, never for a write; polls and
    /// updates never wait for it.
    pub fn for_each(&self, now_ms: u64, f: impl FnMut(&str, u64, u32, &[FieldState])) {
        self.walk_shards(now_ms, None, false, |_| {}, f);
    }

    /// Insert a box as a snapshot recorded it at `now_ms`: `state` has one
    /// entry per plan field, `idle_s` is how long it had accepted no message
    /// (its ttl runs on from there). The payload is rendered again (so a changed
    /// field name or order cannot leave stale payloads); a key already present
    /// is refused.
    pub fn restore(
        &self,
        key: &str,
        version: u64,
        idle_s: u32,
        state: &[FieldState],
        now_ms: u64,
    ) -> Result<(), RestoreError> {
        self.check_key(key).map_err(|e| match e {
            MessageError::EmptyKey => RestoreError::EmptyKey,
            _ => RestoreError::KeyTooLong {
                max: self.plan.max_key_bytes,
            },
        })?;
        if version == 0 {
            return Err(RestoreError::ZeroVersion);
        }
        let fields = &self.plan.fields;
        if state.len() != fields.len() {
            return Err(RestoreError::FieldCount {
                expected: fields.len(),
                found: state.len(),
            });
        }
        for (f, s) in fields.iter().zip(state) {
            if !s.fits(f.ty, f.reduce == Reduce::Count) {
                return Err(RestoreError::WrongType {
                    field: f.name.clone(),
                });
            }
        }
        // A box a newer file of the chain restored already (a restart reads
        // the deltas newest first, then the base): refused before its payload
        // is rendered, with one probe.
        let hash = self.hasher.hash_one(key.as_bytes());
        let shard = self.shard(hash);
        let guard = epoch::pin();
        let _writer = shard.lock();
        if self
            .find(shard, hash, &guard, |p| {
                read_slot(p.slot, &guard, key.as_bytes(), None)
            })
            .is_some()
        {
            return Err(RestoreError::Duplicate);
        }
        let words = with_scratch(|scratch| {
            scratch.clear();
            for s in state {
                codec::encode(s.view(), &mut scratch.state);
            }
            let Scratch {
                state: st,
                payload,
                image,
            } = scratch;
            render_fields(&self.plan, key, version, codec::Decoder::new(st), payload);
            if payload.len() > self.plan.max_payload_bytes {
                return Err(RestoreError::PayloadTooLarge {
                    max: self.plan.max_payload_bytes,
                });
            }
            Ok(new_words(
                image,
                version,
                key,
                record::escapes(key),
                st,
                Payload::Rendered(payload),
            ))
        })?;
        let expires = match self.expires_at(now_ms) {
            NEVER => NEVER,
            fresh => fresh.saturating_sub(idle_s).max(second(now_ms)),
        };
        if !self.has_id_room(shard) {
            return Err(RestoreError::TooManyBoxes {
                max: self.plan.max_boxes,
            });
        }
        self.reserve_box().map_err(|_| RestoreError::TooManyBoxes {
            max: self.plan.max_boxes,
        })?;
        // Generation 0: in the chain already, in no delta until written again.
        // Mark 0: at or below every cut (a client of a room from before a
        // restart is listed again: `Lanes::honors`).
        if let Some(n) = self.insert(shard, hash, words, (0, 0), expires, &guard) {
            self.order_insert(shard, n, key.as_bytes(), &guard);
        }
        Ok(())
    }
}
