//! A record's delivery tag: which connection awaits it (its worker, its
//! request, its place in the request), carried as the delivery report's
//! opaque value, so nothing is added to the record itself.
//!
//! What it is not: the core's request id (`Host::log_request`), which is one
//! part of it.

/// Which connection awaits a record: its worker, its request, its place in
/// the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeliveryTag {
    pub(crate) worker: u16,
    pub(crate) request: u64,
    pub(crate) index: u32,
}

/// Bits of the opaque value: 10 for the worker, 25 for the request (a
/// worker's request ids wrap there: [`REQUEST_MASK`]), 28 for the index,
/// and the top bit set (an opaque value of 0 is librdkafka's "none").
const WORKER_BITS: u32 = 10;
const REQUEST_BITS: u32 = 25;
const INDEX_BITS: u32 = 28;
const OURS: u64 = 1 << 63;
/// Request ids a worker hands out stay under this (they wrap: two requests
/// awaiting their records at once are never 2^25 requests apart).
pub(crate) const REQUEST_MASK: u64 = (1 << REQUEST_BITS) - 1;
/// Workers a tag can name.
pub(crate) const MAX_WORKERS: usize = 1 << WORKER_BITS;
/// A record's place in its request, as far as a tag names it: a request of
/// more messages names the later ones' refusals by this index.
pub(crate) const MAX_INDEX: u32 = (1 << INDEX_BITS) - 1;

impl DeliveryTag {
    /// The opaque value of a record (a worker past [`MAX_WORKERS`] is not
    /// started on a node of a log).
    pub(crate) fn encode(self) -> usize {
        let worker = u64::from(self.worker) & (MAX_WORKERS as u64 - 1);
        let v = (worker << (REQUEST_BITS + INDEX_BITS))
            | ((self.request & REQUEST_MASK) << INDEX_BITS)
            | u64::from(self.index.min(MAX_INDEX));
        (v | OURS) as usize
    }

    /// The tag of an opaque value, if it is one.
    pub(crate) fn decode(v: usize) -> Option<DeliveryTag> {
        let v = v as u64;
        if v & OURS == 0 {
            return None;
        }
        let v = v & !OURS;
        Some(DeliveryTag {
            worker: (v >> (REQUEST_BITS + INDEX_BITS)) as u16,
            request: (v >> INDEX_BITS) & REQUEST_MASK,
            index: (v & u64::from(MAX_INDEX)) as u32,
        })
    }
}

/// The tests' tag: worker 3, `request`, `index`.
#[cfg(test)]
pub(crate) fn t(request: u64, index: u32) -> DeliveryTag {
    DeliveryTag {
        worker: 3,
        request,
        index,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_round_trips_through_its_opaque_value_and_anything_else_is_none() {
        let a = DeliveryTag {
            worker: (MAX_WORKERS - 1) as u16,
            request: REQUEST_MASK,
            index: MAX_INDEX,
        };
        let b = DeliveryTag {
            worker: 0,
            request: 0,
            index: 0,
        };
        for x in [a, b, t(12_345, 99)] {
            assert_eq!(DeliveryTag::decode(x.encode()), Some(x));
            assert_ne!(x.encode(), 0);
        }
        // Request ids wrap; an index past the bits names the last.
        assert_eq!(
            DeliveryTag::decode(t(REQUEST_MASK + 5, 1).encode()),
            Some(t(4, 1))
        );
        assert_eq!(
            DeliveryTag::decode(t(1, u32::MAX).encode()).map(|x| x.index),
            Some(MAX_INDEX)
        );
        assert_eq!(DeliveryTag::decode(0), None);
        assert_eq!(DeliveryTag::decode(12_345), None);
    }
}
