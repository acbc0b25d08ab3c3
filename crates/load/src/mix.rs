//! Operations the generator sends ([`Op`]) and the weighted mix of them (`--mix`).

use std::fmt;

/// One kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// `GET /v1/boxes/{key}`
    Poll,
    /// `POST /v1/boxes/{key}` with one message.
    Ingest,
    /// `POST /v1/ingest` with a JSON array of `--batch-size` messages.
    Batch,
    /// `GET /v1/boxes/{key}?after=<last seen version>&wait_ms=<--longpoll-wait>`
    LongPoll,
    /// `GET /v1/boxes?keys=<--keys-per-request keys>` with `If-None-Match` of the last
    /// ETag the connection saw for that key set.
    PollMany,
    /// `GET /v1/boxes?keys=...&wait_ms=<--longpoll-wait>` with `If-None-Match` of the
    /// last ETag the connection saw for that key set: parks until one of them moves.
    LongPollMany,
}

impl Op {
    /// Every operation, in report order.
    pub const ALL: [Op; 6] = [
        Op::Poll,
        Op::Ingest,
        Op::Batch,
        Op::LongPoll,
        Op::PollMany,
        Op::LongPollMany,
    ];

    /// The name used in `--mix` and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Op::Poll => "poll",
            Op::Ingest => "ingest",
            Op::Batch => "batch",
            Op::LongPoll => "longpoll",
            Op::PollMany => "poll_many",
            Op::LongPollMany => "longpoll_many",
        }
    }

    /// Whether the operation asks for many boxes at once (`GET /v1/boxes?keys=...`).
    pub fn is_many(self) -> bool {
        matches!(self, Op::PollMany | Op::LongPollMany)
    }

    /// Whether the operation parks on the server for up to `--longpoll-wait`.
    pub fn waits(self) -> bool {
        matches!(self, Op::LongPoll | Op::LongPollMany)
    }

    /// Position in [`Op::ALL`], for per-operation arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The operation with this name.
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A weighted mix like `poll:90,ingest:10`. Weights are relative (they need not add up
/// to 100); each request picks its operation independently with these odds.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    /// Operations with their weights, in the order given, weight > 0.
    entries: Vec<(Op, u32)>,
    /// Running sums of the weights scaled to the full `u32` range, for [`Mix::pick`].
    thresholds: Vec<u64>,
}

impl Default for Mix {
    fn default() -> Mix {
        Mix::from_entries(vec![(Op::Poll, 90), (Op::Ingest, 10)])
    }
}

impl Mix {
    /// Parses `op:weight,op:weight,...`. A bare `op` means weight 1.
    pub fn parse(text: &str) -> Result<Mix, String> {
        let mut entries: Vec<(Op, u32)> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = match part.split_once(':') {
                Some((name, weight)) => {
                    let weight: u32 = weight.trim().parse().map_err(|_| {
                        format!("invalid mix {text:?}: weight {weight:?} of {name} is not a whole number")
                    })?;
                    (name.trim(), weight)
                }
                None => (part, 1),
            };
            let op = Op::from_name(name).ok_or_else(|| {
                format!("invalid mix {text:?}: unknown operation {name:?} (use poll, ingest, batch, longpoll, poll_many, longpoll_many)")
            })?;
            if entries.iter().any(|(seen, _)| *seen == op) {
                return Err(format!("invalid mix {text:?}: {name} appears twice"));
            }
            if weight > 0 {
                entries.push((op, weight));
            }
        }
        if entries.is_empty() {
            return Err(format!(
                "invalid mix {text:?}: no operation with a weight above 0"
            ));
        }
        Ok(Mix::from_entries(entries))
    }

    fn from_entries(entries: Vec<(Op, u32)>) -> Mix {
        let total: u64 = entries.iter().map(|&(_, w)| u64::from(w)).sum();
        let mut running = 0u64;
        let thresholds = entries
            .iter()
            .map(|&(_, w)| {
                running += u64::from(w);
                // Scale to [0, 2^32] so a uniform u32 picks with the right odds.
                (running << 32) / total
            })
            .collect();
        Mix {
            entries,
            thresholds,
        }
    }

    /// Operations in the mix with their weights, in the order given.
    pub fn entries(&self) -> &[(Op, u32)] {
        &self.entries
    }

    /// Whether the mix sends this operation at all.
    pub fn contains(&self, op: Op) -> bool {
        self.entries.iter().any(|&(o, _)| o == op)
    }

    /// The operation for a uniform random `u32`.
    #[inline]
    pub fn pick(&self, random: u32) -> Op {
        let r = u64::from(random);
        for (i, &threshold) in self.thresholds.iter().enumerate() {
            if r < threshold {
                return self.entries[i].0;
            }
        }
        // Only reachable through rounding at the very top; the last entry owns it.
        self.entries[self.entries.len() - 1].0
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (op, weight)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{op}:{weight}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_weights_in_order() {
        let mix = Mix::parse("poll:90,ingest:10").unwrap();
        assert_eq!(mix.entries(), &[(Op::Poll, 90), (Op::Ingest, 10)]);
        assert_eq!(mix.to_string(), "poll:90,ingest:10");
        let mix = Mix::parse(" longpoll , batch:3 ").unwrap();
        assert_eq!(mix.entries(), &[(Op::LongPoll, 1), (Op::Batch, 3)]);
        let mix = Mix::parse("poll_many:3,longpoll_many").unwrap();
        assert_eq!(mix.entries(), &[(Op::PollMany, 3), (Op::LongPollMany, 1)]);
        assert_eq!(mix.to_string(), "poll_many:3,longpoll_many:1");
        // A zero weight drops the operation.
        let mix = Mix::parse("poll:1,ingest:0").unwrap();
        assert_eq!(mix.entries(), &[(Op::Poll, 1)]);
        assert!(!mix.contains(Op::Ingest));
    }

    #[test]
    fn names_and_indexes_round_trip() {
        for (i, op) in Op::ALL.into_iter().enumerate() {
            assert_eq!(op.index(), i);
            assert_eq!(Op::from_name(op.name()), Some(op));
        }
        let many: Vec<Op> = Op::ALL.into_iter().filter(|op| op.is_many()).collect();
        assert_eq!(many, [Op::PollMany, Op::LongPollMany]);
        let waits: Vec<Op> = Op::ALL.into_iter().filter(|op| op.waits()).collect();
        assert_eq!(waits, [Op::LongPoll, Op::LongPollMany]);
    }

    #[test]
    fn refuses_bad_mixes() {
        for bad in [
            "",
            "poll:0",
            "post:10",
            "poll:x",
            "poll:-1",
            "poll:1,poll:2",
            "poll_many:1,poll_many:1",
            "pollmany:1",
        ] {
            let err = Mix::parse(bad).expect_err(bad);
            assert!(err.starts_with("invalid mix"), "{bad}: {err}");
        }
    }

    #[test]
    fn picks_with_the_given_odds() {
        let mix = Mix::parse("poll:90,ingest:10").unwrap();
        let mut counts = [0u32; Op::ALL.len()];
        // Evenly spaced u32s stand in for a uniform source.
        let n = 100_000u64;
        for i in 0..n {
            let r = ((i << 32) / n) as u32;
            counts[mix.pick(r).index()] += 1;
        }
        assert_eq!(counts[Op::Poll.index()], 90_000);
        assert_eq!(counts[Op::Ingest.index()], 10_000);
        assert_eq!(mix.pick(u32::MAX), Op::Ingest);
        assert_eq!(mix.pick(0), Op::Poll);
    }
}
