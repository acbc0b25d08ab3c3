//! `/metrics`: Prometheus text exposition 0.0.4 (docs/operations.md#metrics).
//!
//! Every family is declared once, as data, in [`FAMILIES`]: its name, `# HELP`
//! text, `# TYPE` and label names, with the function that writes its samples.
//! [`render`] walks the declarations in order and nothing else; the order of
//! the table is the order of the exposition.
//!
//! Everything is summed from the per-worker stats at scrape time; jemalloc's
//! epoch is advanced here, on the scraping thread, and nowhere else.
//!
//! What it is not: a registry. The hot counters are plain per-worker fields
//! ([`crate::stats`]) that the workers bump without knowing of this module.

mod families;
mod process;

pub use families::FAMILIES;
pub use process::{process_stats, ProcessStats};

use crate::alloc_stats::{self, JemallocStats};
use crate::shared::Shared;
use crate::stats::{Histogram, WorkerStats};
use std::cell::OnceCell;
use std::fmt::Display;
use std::io::Write;

/// A family's `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family as `/metrics` exposes it.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    /// The `# HELP` text.
    pub help: &'static str,
    pub kind: Kind,
    /// Label names of every sample, in order (a histogram's `le` not among them).
    pub labels: &'static [&'static str],
    /// Writes the samples, after the family's `# HELP` and `# TYPE`.
    samples: fn(&Scrape, &mut Samples),
    /// Whether this node has the family (the log's only on a node built from a log).
    shown: fn(&Scrape) -> bool,
}

impl Family {
    const fn new(
        kind: Kind,
        name: &'static str,
        labels: &'static [&'static str],
        help: &'static str,
        samples: fn(&Scrape, &mut Samples),
    ) -> Family {
        Family {
            name,
            help,
            kind,
            labels,
            samples,
            shown: |_| true,
        }
    }
    const fn histogram(
        name: &'static str,
        help: &'static str,
        samples: fn(&Scrape, &mut Samples),
    ) -> Family {
        Family::new(Kind::Histogram, name, &[], help, samples)
    }
    /// Exposed only where `shown` holds.
    const fn only(mut self, shown: fn(&Scrape) -> bool) -> Family {
        self.shown = shown;
        self
    }
    /// Whether a scrape of this node exposes the family.
    pub fn shown(&self, scrape: &Scrape) -> bool {
        (self.shown)(scrape)
    }
}

/// What one scrape reads: the server's state, and the figures that cost a
/// system call or a jemalloc epoch, each read at most once, when a family
/// first asks for it.
pub struct Scrape<'a> {
    shared: &'a Shared,
    accounted: OnceCell<Accounted>,
    jemalloc: OnceCell<JemallocStats>,
    process: OnceCell<ProcessStats>,
}

impl<'a> Scrape<'a> {
    pub(crate) fn new(shared: &'a Shared) -> Self {
        Scrape {
            shared,
            accounted: OnceCell::new(),
            jemalloc: OnceCell::new(),
            process: OnceCell::new(),
        }
    }
    /// The running workers' stats, by worker index.
    fn workers(&self) -> impl Iterator<Item = (usize, &'a WorkerStats)> {
        self.shared
            .stats()
            .iter()
            .take(self.shared.workers())
            .enumerate()
    }
    /// One counter summed over every worker's stats.
    fn sum(&self, f: impl Fn(&WorkerStats) -> u64) -> u64 {
        self.shared.stats().iter().map(f).sum()
    }
    /// The largest value of one gauge among the workers.
    fn max(&self, f: impl Fn(&WorkerStats) -> u64) -> u64 {
        self.shared.stats().iter().map(f).max().unwrap_or(0)
    }
    fn accounted(&self) -> &Accounted {
        self.accounted.get_or_init(|| accounted(self.shared))
    }
    fn jemalloc(&self) -> &JemallocStats {
        self.jemalloc.get_or_init(alloc_stats::read_global)
    }
    fn process(&self) -> &ProcessStats {
        self.process.get_or_init(process_stats)
    }
}

/// Writes one family's sample lines into the exposition.
pub struct Samples<'o> {
    out: &'o mut Vec<u8>,
    family: &'static Family,
}

impl Samples<'_> {
    /// `name value`, for a family without labels.
    fn value(&mut self, v: impl Display) {
        debug_assert!(self.family.labels.is_empty(), "{}", self.family.name);
        let _ = writeln!(self.out, "{} {v}", self.family.name);
    }
    /// `name{label="value",...} v`, the label values in the family's label order.
    fn labelled(&mut self, values: &[&dyn Display], v: impl Display) {
        let labels = self.family.labels;
        debug_assert_eq!(labels.len(), values.len(), "{}", self.family.name);
        // The fixed parts copied, only the values formatted: as cheap as the
        // hand-written format strings this replaced.
        self.out.extend_from_slice(self.family.name.as_bytes());
        for (i, (label, value)) in labels.iter().zip(values).enumerate() {
            self.out.push(if i == 0 { b'{' } else { b',' });
            self.out.extend_from_slice(label.as_bytes());
            let _ = write!(self.out, "=\"{value}\"");
        }
        let _ = writeln!(self.out, "}} {v}");
    }
    /// One sample per item, labelled with its name.
    fn each<T: Copy>(
        &mut self,
        items: &[T],
        name: fn(T) -> &'static str,
        value: impl Fn(T) -> u64,
    ) {
        for &item in items {
            self.labelled(&[&name(item)], value(item));
        }
    }
    /// One sample per running worker: `name{worker="w"} value`.
    fn per_worker<V: Display>(
        &mut self,
        scrape: &Scrape,
        value: impl Fn(usize, &WorkerStats) -> V,
    ) {
        for (w, s) in scrape.workers() {
            self.labelled(&[&w], value(w, s));
        }
    }
    /// Cumulative buckets, `_sum` in seconds and `_count`, from non-cumulative
    /// counts (the last one +Inf).
    fn histogram(&mut self, bounds: &[f64], counts: &[u64], sum_ns: u64) {
        let name = self.family.name;
        let mut cum = 0;
        for (b, c) in bounds.iter().zip(counts) {
            cum += c;
            let _ = writeln!(self.out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        cum += counts[bounds.len()];
        let _ = writeln!(self.out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
        let _ = writeln!(self.out, "{name}_sum {}", sum_ns as f64 / 1e9);
        let _ = writeln!(self.out, "{name}_count {cum}");
    }
    /// A histogram kept per worker, merged over the workers.
    fn merged<const N: usize>(
        &mut self,
        scrape: &Scrape,
        bounds: &[f64; N],
        of: impl Fn(&WorkerStats) -> &Histogram<N>,
    ) {
        let mut counts = vec![0u64; N + 1];
        let mut sum_ns = 0;
        for s in scrape.shared.stats() {
            let h = of(s);
            for (total, c) in counts.iter_mut().zip(h.counts()) {
                *total += c;
            }
            sum_ns += h.sum_ns();
        }
        self.histogram(bounds, &counts, sum_ns);
    }
}

/// Render every family this node has into `out`, in declaration order.
pub(crate) fn render(shared: &Shared, out: &mut Vec<u8>) {
    let scrape = Scrape::new(shared);
    for family in FAMILIES {
        if !family.shown(&scrape) {
            continue;
        }
        let (name, help, kind) = (family.name, family.help, family.kind.name());
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
        (family.samples)(&scrape, &mut Samples { out, family });
    }
}

/// Memory as pollbox accounts it, by part.
#[derive(Debug, Default, Clone, Copy)]
pub struct Accounted {
    pub arena: u64,
    pub boxes: u64,
    pub buffers: u64,
    pub send_queue: u64,
    pub runtime: u64,
    /// The key order's tombstones (docs/boxes.md#watermarks).
    pub tombstones: u64,
}

impl Accounted {
    pub fn total(&self) -> u64 {
        self.arena + self.boxes + self.buffers + self.send_queue + self.runtime + self.tombstones
    }
}

pub(crate) fn accounted(shared: &Shared) -> Accounted {
    let mut a = Accounted {
        boxes: shared.node().boxes.accounted_bytes() as u64,
        tombstones: shared.node().boxes.tombstone_bytes() as u64,
        runtime: shared.runtime_bytes() as u64,
        ..Default::default()
    };
    for s in shared.stats() {
        a.arena += s.arena_capacity.get();
        a.buffers += s.buffer_bytes.get();
        a.send_queue += s.send_queue_bytes.get();
    }
    a
}

#[cfg(test)]
mod tests;
