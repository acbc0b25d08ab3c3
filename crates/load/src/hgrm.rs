//! The full percentile spectrum in HdrHistogram's text format, as wrk2 and
//! HdrHistogram_c's `hdr_percentiles_print` (CLASSIC) write it, values in milliseconds.
//! The HdrHistogram plotter (hdrhistogram.github.io/HdrHistogram/plotFiles.html) reads it.

use std::io::{self, Write};

use hdrhistogram::Histogram;

/// Percentile ticks per half distance to 100%, as wrk2 prints them.
const TICKS_PER_HALF_DISTANCE: u32 = 5;
const NS_PER_MS: f64 = 1e6;

/// Writes `histogram` (nanoseconds) as an `.hgrm` spectrum in milliseconds.
pub fn write_hgrm(histogram: &Histogram<u64>, out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        "{:>12} {:>12} {:>12} {:>12}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    )?;
    let mut total = 0u64;
    if !histogram.is_empty() {
        for step in histogram.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
            total += step.count_since_last_iteration();
            let value = step.value_iterated_to() as f64 / NS_PER_MS;
            let quantile = step.quantile_iterated_to();
            if quantile < 1.0 {
                writeln!(
                    out,
                    "{value:>12.3} {quantile:>12.6} {total:>12} {:>12.2}",
                    1.0 / (1.0 - quantile)
                )?;
            } else {
                writeln!(
                    out,
                    "{value:>12.3} {quantile:>12.6} {total:>12} {:>12}",
                    "inf"
                )?;
            }
        }
    }
    let ms = |ns: f64| ns / NS_PER_MS;
    writeln!(
        out,
        "#[Mean    = {:>12.3}, StdDeviation   = {:>12.3}]",
        ms(histogram.mean()),
        ms(histogram.stdev())
    )?;
    writeln!(
        out,
        "#[Max     = {:>12.3}, Total count    = {:>12}]",
        ms(histogram.max() as f64),
        histogram.len()
    )?;
    writeln!(
        out,
        "#[Buckets = {:>12}, SubBuckets     = {:>12}]",
        histogram.buckets(),
        sub_buckets(histogram.sigfig())
    )
}

/// Sub-buckets per bucket: the smallest power of two above 2·10^sigfig.
fn sub_buckets(sigfig: u8) -> u64 {
    (2 * 10u64.pow(u32::from(sigfig))).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::latency_histogram;

    #[test]
    fn spectrum_has_wrk2s_shape() {
        let mut h = latency_histogram();
        for i in 1..=1000u64 {
            h.record(i * 1000).unwrap(); // 1 µs .. 1 ms
        }
        let mut out = Vec::new();
        write_hgrm(&h, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "       Value   Percentile   TotalCount 1/(1-Percentile)"
        );
        assert_eq!(lines[1], "");
        let rows: Vec<Vec<&str>> = lines[2..]
            .iter()
            .take_while(|l| !l.starts_with('#'))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert!(rows.len() > 20);
        let mut last_p = -1.0;
        let mut last_count = 0;
        for row in &rows {
            assert_eq!(row.len(), 4, "{row:?}");
            let p: f64 = row[1].parse().unwrap();
            let count: u64 = row[2].parse().unwrap();
            assert!(p >= last_p && count >= last_count, "{row:?}");
            last_p = p;
            last_count = count;
        }
        let first = &rows[0];
        assert_eq!(first[0], "0.001");
        assert_eq!(first[1], "0.000000");
        assert_eq!(first[3], "1.00");
        let end = rows.last().unwrap();
        assert_eq!(end[1], "1.000000");
        assert_eq!(end[2], "1000");
        assert_eq!(end[3], "inf");
        let footer = &lines[2 + rows.len()..];
        assert_eq!(footer.len(), 3);
        assert!(
            footer[0].starts_with("#[Mean    =        0.50"),
            "{}",
            footer[0]
        );
        assert!(
            footer[1].starts_with("#[Max     =        1.00"),
            "{}",
            footer[1]
        );
        assert!(footer[1].ends_with("Total count    =         1000]"));
        assert!(footer[2].ends_with("SubBuckets     =         2048]"));
    }

    #[test]
    fn empty_histogram_has_header_and_footer_only() {
        let mut out = Vec::new();
        write_hgrm(&latency_histogram(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 5);
        assert!(text.contains("Total count    =            0]"));
    }
}
