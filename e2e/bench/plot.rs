//! The sweep's plots (SVG): resume latency and API requests per session against N, ours beside
//! the API floor and agent-sandbox's relaunch.

use std::path::Path;

use plotters::prelude::*;

use crate::BoxError;
use crate::report::{FLOOR, OURS, PhaseResult, Report, SANDBOX};

/// The series of one contender: which phase stands for "resume", and its colour.
const SERIES: [(&str, &str, RGBColor); 3] = [
    (OURS, "resume", RGBColor(31, 119, 180)),
    (FLOOR, "resume", RGBColor(44, 160, 44)),
    (SANDBOX, "relaunch", RGBColor(214, 39, 40)),
];

type Metric = fn(&PhaseResult) -> Option<f64>;

/// Writes `latency.svg` and `api-requests.svg` into `dir`; returns the files written (none when
/// the report has fewer than two fleet sizes).
pub fn write(report: &Report, dir: &Path) -> Result<Vec<String>, BoxError> {
    let sizes: std::collections::BTreeSet<usize> = report.results.iter().map(|r| r.n).collect();
    if sizes.len() < 2 {
        return Ok(Vec::new());
    }
    let latency: [(&str, Metric); 2] =
        [("p50", |r| r.quantile(0.5)), ("p95", |r| r.quantile(0.95))];
    let requests: [(&str, Metric); 1] = [("", |r| Some(r.total_per_session()))];
    chart(
        report,
        &dir.join("latency.svg"),
        "Resume latency vs fleet size",
        "seconds",
        &latency,
    )?;
    chart(
        report,
        &dir.join("api-requests.svg"),
        "API requests per session vs fleet size (resume; agent-sandbox: relaunch)",
        "requests per session",
        &requests,
    )?;
    Ok(vec!["latency.svg".into(), "api-requests.svg".into()])
}

fn points(report: &Report, contender: &str, phase: &str, metric: Metric) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = report
        .results
        .iter()
        .filter(|r| r.contender == contender && r.phase == phase)
        .filter_map(|r| Some((r.n as f64, metric(r)?)))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

/// One line of a chart.
struct Line {
    name: String,
    colour: RGBColor,
    /// Drawn lighter (the second metric of a contender, e.g. p95 beside p50).
    secondary: bool,
    points: Vec<(f64, f64)>,
}

fn chart(
    report: &Report,
    path: &Path,
    title: &str,
    y_label: &str,
    metrics: &[(&str, Metric)],
) -> Result<(), BoxError> {
    let all: Vec<Line> = SERIES
        .iter()
        .flat_map(|(contender, phase, colour)| {
            metrics
                .iter()
                .enumerate()
                .map(move |(i, (label, metric))| Line {
                    name: if label.is_empty() {
                        contender.to_string()
                    } else {
                        format!("{contender} {label}")
                    },
                    colour: *colour,
                    secondary: i > 0,
                    points: points(report, contender, phase, *metric),
                })
        })
        .filter(|line| !line.points.is_empty())
        .collect();
    let x_max = all
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let y_max = all
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.15;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max * 1.05, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("N (sessions)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(y_label)
        .draw()?;
    for line in all {
        let style = if line.secondary {
            line.colour.mix(0.45).stroke_width(2)
        } else {
            line.colour.stroke_width(3)
        };
        chart
            .draw_series(LineSeries::new(line.points.clone(), style))?
            .label(line.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(
            line.points
                .into_iter()
                .map(|p| Circle::new(p, 4, style.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_svg_plots_for_a_sweep() {
        let mut report = Report::default();
        for (n, secs) in [(50, 1.0), (100, 2.0)] {
            for (contender, phase, _) in SERIES {
                let mut r = PhaseResult::new(contender, phase, n);
                r.set_latencies(vec![std::time::Duration::from_secs_f64(secs)]);
                r.requests.add("get", "pods", n as u64 * 3);
                report.results.push(r);
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let files = write(&report, dir.path()).expect("plots");
        assert_eq!(files.len(), 2);
        let svg = std::fs::read_to_string(dir.path().join("latency.svg")).expect("svg");
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(
            svg.contains("ours p50") && svg.contains("agent-sandbox p95"),
            "legend"
        );
        let single = Report {
            results: report.results[..3].to_vec(),
            ..Default::default()
        };
        assert!(write(&single, dir.path()).expect("none").is_empty());
    }
}
