//! The outcomes of this node's records that one pass of the consuming
//! thread applied, gathered and handed to the workers together: a batch's
//! records come back to its connection as a few counted reports (its
//! records applied in a run, [`LogReport::count`]), and each worker is woken
//! once a pass, not once a record (a wake-up is an eventfd write and a
//! switch to the worker: BENCHMARKS.md, "The Kafka log").
//!
//! What it is not: the wait itself (`pollbox_core::service::Pending` counts
//! the reports), or a delay: a pass ends as soon as the client's queue is
//! empty, so a lone record is reported as soon as it is applied.

use super::DeliveryTag;
use crate::wakeups::{LogReport, Wakeups};
use pollbox_core::service::Report;

/// How far back a report looks for one of the same request to count
/// itself in: a request's records arrive in runs (a partition's in offset
/// order), its other partitions' runs interleaved.
const MERGE_WINDOW: usize = 8;

/// The reports of one pass, by worker.
pub(crate) struct PassReports {
    by_worker: Vec<Vec<LogReport>>,
    records: u32,
}

impl PassReports {
    /// For a node of `workers` workers.
    pub(crate) fn new(workers: usize) -> PassReports {
        PassReports {
            by_worker: (0..workers).map(|_| Vec::new()).collect(),
            records: 0,
        }
    }

    /// The record `tag` names met `report`. A tag naming no worker of this
    /// node (it cannot be this node's) is ignored.
    pub(crate) fn add(&mut self, tag: DeliveryTag, report: Report) {
        let DeliveryTag {
            worker,
            request,
            index,
        } = tag;
        let Some(list) = self.by_worker.get_mut(worker as usize) else {
            return;
        };
        self.records += 1;
        if matches!(report, Report::Applied | Report::NoBox) {
            if let Some(r) = list
                .iter_mut()
                .rev()
                .take(MERGE_WINDOW)
                .find(|r| r.request == request && r.report == report)
            {
                r.count += 1;
                r.index = r.index.min(index);
                return;
            }
        }
        list.push(LogReport {
            request,
            index,
            report,
            count: 1,
        });
    }

    /// Records reported since the last hand-over.
    pub(crate) fn records(&self) -> u32 {
        self.records
    }

    /// Hand every report to its worker, each woken once.
    pub(crate) fn hand_over(&mut self, wakeups: &Wakeups) {
        if self.records == 0 {
            return;
        }
        for (w, list) in self.by_worker.iter_mut().enumerate() {
            wakeups.report_all(w, list);
        }
        self.records = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollbox_core::plan::MessageError;

    #[test]
    fn a_requests_applied_records_are_counted_together_and_refusals_apart() {
        let mut p = PassReports::new(2);
        let mut add = |worker, request, index, report| {
            p.add(
                DeliveryTag {
                    worker,
                    request,
                    index,
                },
                report,
            )
        };
        for i in 0..5 {
            add(1, 7, i, Report::Applied);
        }
        add(1, 8, 0, Report::Applied);
        add(1, 7, 5, Report::Refused(MessageError::TooManyBoxes));
        add(1, 7, 6, Report::Applied);
        add(0, 9, 3, Report::NoBox);
        add(5, 1, 0, Report::Applied); // no such worker
        assert_eq!(p.records(), 9);
        let applied = |request, index, count| LogReport {
            request,
            index,
            report: Report::Applied,
            count,
        };
        assert_eq!(
            p.by_worker[1],
            vec![
                applied(7, 0, 6),
                applied(8, 0, 1),
                LogReport {
                    request: 7,
                    index: 5,
                    report: Report::Refused(MessageError::TooManyBoxes),
                    count: 1
                },
            ]
        );
        assert_eq!(p.by_worker[0].len(), 1);
    }
}
