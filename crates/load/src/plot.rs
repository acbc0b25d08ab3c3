//! `--plot FILE.svg`: latency by percentile, the classic HdrHistogram picture. The x axis
//! is 1/(1-percentile) on a log scale (labelled 90%, 99%, 99.9%, ...), the y axis is
//! latency in milliseconds on a log scale (a stall of 200 ms and a 30 µs median fit on
//! one chart), one line per operation.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;

const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// Draws one line per `(name, histogram in ns)` into an SVG at `path`.
pub fn write_plot(
    path: &Path,
    title: &str,
    series: &[(&str, &Histogram<u64>)],
) -> Result<(), String> {
    let lines: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(name, h)| (*name, spectrum(h)))
        .collect();
    // Right end: the decade past the deepest finite percentile; 100% is drawn there.
    let deepest = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.0))
        .filter(|x| x.is_finite())
        .fold(10.0f64, f64::max);
    let x_max = 10f64.powf(deepest.log10().ceil()).max(10.0);
    let (mut y_min, mut y_max) = (f64::INFINITY, 0.0f64);
    for (_, points) in &lines {
        for &(_, y) in points {
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
    }
    if !y_min.is_finite() {
        (y_min, y_max) = (0.001, 1.0);
    }
    let y_min = (y_min * 0.8).max(1e-6);
    let y_max = (y_max * 1.25).max(y_min * 10.0);

    let root = SVGBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .margin_right(40)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((1.0f64..x_max).log_scale(), (y_min..y_max).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, points)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = points
            .iter()
            .map(|&(x, y)| (if x.is_finite() { x.min(x_max) } else { x_max }, y));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// `(1/(1-percentile), latency ms)` points; the 100% point has x = ∞.
fn spectrum(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    h.iter_quantiles(TICKS_PER_HALF_DISTANCE)
        .map(|step| {
            let q = step.quantile_iterated_to();
            let x = if q < 1.0 {
                1.0 / (1.0 - q)
            } else {
                f64::INFINITY
            };
            (x, step.value_iterated_to() as f64 / 1e6)
        })
        .collect()
}

/// Axis label for x = 1/(1-p): 1 → 0%, 10 → 90%, 1000 → 99.9%.
fn percentile_label(x: f64) -> String {
    if x <= 1.0 {
        return "0%".to_string();
    }
    let p = 100.0 * (1.0 - 1.0 / x);
    let nines = x.log10().round() as i32;
    let decimals = (nines - 2).max(0) as usize;
    format!("{p:.decimals$}%")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::latency_histogram;

    #[test]
    fn labels() {
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(100.0), "99%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        assert_eq!(percentile_label(100_000.0), "99.999%");
    }

    #[test]
    fn draws_an_svg_with_a_line_per_operation() {
        let mut poll = latency_histogram();
        let mut ingest = latency_histogram();
        for i in 1..=10_000u64 {
            poll.record(20_000 + i).unwrap();
            ingest.record(50_000 + 10 * i).unwrap();
        }
        ingest.record(200_000_000).unwrap();
        let dir = std::env::temp_dir().join(format!("pollbox-load-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("latency.svg");
        write_plot(
            &path,
            "offered 2000 req/s, achieved 1999 req/s",
            &[
                ("poll", &poll),
                ("ingest", &ingest),
                ("batch", &latency_histogram()),
            ],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.contains("offered 2000 req/s, achieved 1999 req/s"));
        assert!(svg.contains("\npoll\n") && svg.contains("\ningest\n"));
        assert!(!svg.contains("\nbatch\n"), "empty operations are left out");
        assert!(svg.contains("\n99.9%\n") && svg.contains("\nlatency (ms)\n"));
        assert!(svg.matches("<polyline").count() >= 2);
    }
}
