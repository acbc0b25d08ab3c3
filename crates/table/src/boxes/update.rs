//! The update path: one message applied to a box, found by a lookup
//! ([`BoxTable::update`]) or missed by it ([`BoxTable::create`]), and the
//! record it leaves (its size class, its words).

use std::sync::atomic::Ordering;

use crossbeam_epoch::Guard;

use super::record::{self, Payload};
use super::reduce::{next_record, Message, Prior, Reducers};
use super::slot::Words;
use super::{expiry::touch, read_slot, size_class, whole_words, BoxTable, Place, Shard};
use crate::plan::MessageError;

/// Where an applied message's version comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stamp {
    /// One past the box's version (a new box: past its shard's floor).
    Next,
    /// The log's: the record's position.
    At(u64),
}

/// What `update` and `create` return for a record the box already holds
/// (never a version: versions start at 1).
pub(super) const REPLAYED: u64 = 0;

/// A change to one box: the message, where its version comes from, and the
/// expiry stamp it leaves (whole seconds of the table's clock).
#[derive(Clone, Copy)]
pub(super) struct Change<'a> {
    pub msg: Message<'a>,
    pub stamp: Stamp,
    pub expires: u32,
    /// The change's mark (`lanes.rs`).
    pub mark: u64,
}

/// The size class a record of `key`, `state` and a payload of `payload_len`
/// bytes moves to from a record of `now` bytes, `None` to stay. It grows when
/// it does not fit; it shrinks only when a class half the size would do, so a
/// payload wavering around a class edge does not reallocate on every message.
fn resize(key: &str, escapes: bool, state: &[u8], payload_len: usize, now: usize) -> Option<usize> {
    let need = record::size(key, escapes, state, payload_len);
    let class = size_class(need);
    (need > now || class <= now / 2).then_some(class)
}

/// A new record's words (built in `image`, a scratch buffer, so the words are
/// the only allocation); `escapes`: whether JSON escapes `key`
/// ([`record::escapes`]).
pub(super) fn new_words(
    image: &mut Vec<u8>,
    version: u64,
    key: &str,
    escapes: bool,
    state: &[u8],
    p: Payload<'_>,
) -> Words {
    image.clear();
    image.resize(size_class(record::size(key, escapes, state, p.len())), 0);
    record::write(image, version, key, escapes, state, p);
    Words::new(image)
}

impl BoxTable {
    /// The table's reducers, for [`next_record`].
    #[inline]
    fn reducers(&self) -> Reducers<'_> {
        Reducers {
            plan: &self.plan,
            heads: &self.heads,
        }
    }

    /// Apply `change` to an existing box, found at `place`, shared with
    /// readers and other writers: read the record, build the next one from
    /// that copy, and store it if nothing was stored meanwhile (else start
    /// again from a fresh copy); a record that needs another size class is
    /// swapped for a new allocation under the same claim. `Ok(None)` when the
    /// slot no longer holds the box (removed, or another box moved in): look
    /// it up again.
    pub(super) fn update(
        &self,
        shard: &Shard,
        place: Place<'_>,
        change: &Change<'_>,
        out: Option<&mut Vec<u8>>,
        guard: &Guard,
    ) -> Result<Option<u64>, MessageError> {
        let key = change.msg.key;
        self.with_record_scratch(|s| {
            let (state, payload, image) = (&mut s.state, &mut s.payload, &mut s.image);
            loop {
                let r = place.slot.begin(guard);
                r.load(image);
                if !r.valid() {
                    continue;
                }
                if r.is_empty() || !record::key_is(image, key.as_bytes()) {
                    return Ok(None);
                }
                let base = match change.stamp {
                    Stamp::Next => record::version(image),
                    Stamp::At(v) if v <= record::version(image) => return Ok(Some(REPLAYED)),
                    Stamp::At(v) => v.saturating_sub(1),
                };
                let prior = Prior {
                    state: record::state(image),
                    version: base,
                };
                let (version, len) = next_record(
                    self.reducers(),
                    change.msg,
                    prior,
                    state,
                    payload,
                    out.is_some(),
                )?;
                let next = Payload::of(out.is_some(), payload, len);
                let old = image.len();
                let escapes = record::escapes_in(image);
                match resize(key, escapes, state, len, old) {
                    None => {
                        let used = record::rewrite(image, version, key, state, next);
                        let Some(claim) = r.claim() else {
                            continue;
                        };
                        claim.store(whole_words(image, used));
                        place.gen.store(self.generation_now(), Ordering::Relaxed);
                        place.mark.store(change.mark, Ordering::Relaxed);
                        touch(place.stamp, change.expires);
                    }
                    Some(class) => {
                        let words = new_words(image, version, key, escapes, state, next);
                        let Some(mut claim) = r.claim() else {
                            continue;
                        };
                        claim.replace(words, guard);
                        place.gen.store(self.generation_now(), Ordering::Relaxed);
                        place.mark.store(change.mark, Ordering::Relaxed);
                        touch(place.stamp, change.expires);
                        drop(claim);
                        shard.add_bytes(old, class);
                    }
                }
                if let Some(out) = out {
                    out.extend_from_slice(payload);
                }
                return Ok(Some(version));
            }
        })
    }

    /// Create the box of `change`, missed by a lookup of `hash`: build the
    /// new box outside the mutex (past the shard's floor), then insert it
    /// unless another writer created the key meanwhile (`Ok(None)`: the
    /// caller applies to that box). Should a box of the shard have been
    /// removed meanwhile, the floor moved and the box is built again past it
    /// (rare).
    pub(super) fn create(
        &self,
        shard: &Shard,
        hash: u64,
        change: &Change<'_>,
        out: Option<&mut Vec<u8>>,
        guard: &Guard,
    ) -> Result<Option<u64>, MessageError> {
        let Change {
            msg,
            stamp,
            expires,
            ..
        } = *change;
        let key = msg.key;
        let render = out.is_some();
        let build = |floor: u64| {
            self.with_record_scratch(|s| {
                let (state, payload, image) = (&mut s.state, &mut s.payload, &mut s.image);
                let prior = Prior {
                    state: &[],
                    version: match stamp {
                        Stamp::Next => floor.max(self.version_clock()),
                        Stamp::At(v) => v.saturating_sub(1),
                    },
                };
                let (version, len) =
                    next_record(self.reducers(), msg, prior, state, payload, render)?;
                let next = Payload::of(render, payload, len);
                let escapes = record::escapes(key);
                let words = new_words(image, version, key, escapes, state, next);
                Ok::<_, MessageError>((version, len, words))
            })
        };
        let floor = shard.write.floor.load(Ordering::Acquire);
        let (mut version, mut len, mut words) = build(floor)?;
        let _writer = shard.lock();
        if self
            .find(shard, hash, guard, |p| {
                read_slot(p.slot, guard, key.as_bytes(), None)
            })
            .is_some()
        {
            return Ok(None);
        }
        let now = shard.write.floor.load(Ordering::Relaxed);
        if now != floor && stamp == Stamp::Next {
            (version, len, words) = build(now)?;
        }
        if !self.has_id_room(shard) {
            return Err(MessageError::TooManyBoxes);
        }
        self.reserve_box()?;
        if let Some(out) = out {
            // Rendered into the record, which no one else sees yet.
            words.copy_to(record::HEADER, len, out);
        }
        // Under the shard's mutex: a walk that has begun this shard moved the
        // generation on before it (`changes.rs`).
        let stamps = (self.generation_now(), change.mark);
        if let Some(n) = self.insert(shard, hash, words, stamps, expires, guard) {
            self.order_insert(shard, n, key.as_bytes(), guard);
        }
        Ok(Some(version))
    }

    /// Count one more box, unless that would pass `max_boxes`.
    pub(super) fn reserve_box(&self) -> Result<(), MessageError> {
        let max = self.plan.max_boxes;
        self.boxes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| MessageError::TooManyBoxes)
    }
}
