//! Plots (PNG and SVG) of simulated and measured runs: IOPS and latency over time per tenant, and the
//! split of each tenant's IOs between the reservation and weight phases.
//!
//! Text layout needs a TrueType font; we load DejaVu Sans (Debian's fonts-dejavu-core) or another common
//! sans font from the system. Without one, plots are skipped with a warning (the data files are still
//! written).

use anyhow::{Context, Result};
use plotters::prelude::*;
use rein_sim::Timeseries;
use std::path::Path;
use std::sync::OnceLock;

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Registers a system font for the bitmap backend once; false if none was found.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        for p in FONT_CANDIDATES {
            if let Ok(bytes) = std::fs::read(p) {
                let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, leaked).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// Why plots could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("no TrueType font found for plots (looked for {0}); install one, e.g. apt-get install fonts-dejavu-core")]
pub struct NoFont(String);

fn need_font() -> Result<()> {
    if font_ready() {
        Ok(())
    } else {
        Err(NoFont(FONT_CANDIDATES.join(", ")).into())
    }
}

/// One line of a line chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn palette(i: usize) -> RGBColor {
    const C: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

fn draw_lines<DB: DrawingBackend>(root: DrawingArea<DB, plotters::coord::Shift>, title: &str, x_label: &str, y_label: &str, series: &[Series], dashed: &[Series]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let all = series.iter().chain(dashed.iter()).flat_map(|s| s.points.iter());
    let (mut x1, mut y1) = (1e-9f64, 1e-9f64);
    for &(x, y) in all {
        if x.is_finite() && y.is_finite() {
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
    }
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x1, 0f64..y1 * 1.08)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for (i, s) in series.iter().enumerate() {
        let c = palette(i);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    for s in dashed {
        let c = RGBColor(90, 90, 90);
        chart
            .draw_series(DashedLineSeries::new(s.points.iter().copied(), 6, 4, c.stroke_width(1)))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

/// Writes `<stem>.svg` and (if a font is available) `<stem>.png`.
pub fn line_chart(stem: &Path, title: &str, x_label: &str, y_label: &str, series: &[Series], dashed: &[Series]) -> Result<()> {
    let svg = stem.with_extension("svg");
    need_font()?;
    draw_lines(SVGBackend::new(&svg, (1000, 560)).into_drawing_area(), title, x_label, y_label, series, dashed)
        .with_context(|| format!("writing {}", svg.display()))?;
    let png = stem.with_extension("png");
    draw_lines(BitMapBackend::new(&png, (1000, 560)).into_drawing_area(), title, x_label, y_label, series, dashed)
        .with_context(|| format!("writing {}", png.display()))?;
    Ok(())
}

fn draw_phases<DB: DrawingBackend>(root: DrawingArea<DB, plotters::coord::Shift>, title: &str, rows: &[(String, [f64; 3])]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let n = rows.len().max(1);
    let max = rows.iter().map(|r| r.1.iter().sum::<f64>()).fold(1e-9, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(110)
        .build_cartesian_2d(0f64..max * 1.05, (0..n).into_segmented())
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("IOPS (after warm-up)")
        .y_label_formatter(&|v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => names.get(*i).cloned().unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let colors = [RGBColor(44, 160, 44), RGBColor(31, 119, 180), RGBColor(214, 39, 40)];
    let labels = ["reservation phase", "weight phase", "over limit"];
    for p in 0..3 {
        let c = colors[p];
        chart
            .draw_series(rows.iter().enumerate().map(|(i, r)| {
                let start: f64 = r.1[..p].iter().sum();
                Rectangle::new(
                    [(start, SegmentValue::Exact(i)), (start + r.1[p], SegmentValue::Exact(i + 1))],
                    c.mix(0.85).filled(),
                )
            }))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .label(labels[p])
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

/// Horizontal stacked bars: per tenant, IOPS by phase.
pub fn phase_chart(stem: &Path, title: &str, rows: &[(String, [f64; 3])]) -> Result<()> {
    let h = (120 + 40 * rows.len()).clamp(240, 1400) as u32;
    need_font()?;
    let svg = stem.with_extension("svg");
    draw_phases(SVGBackend::new(&svg, (1000, h)).into_drawing_area(), title, rows).with_context(|| format!("writing {}", svg.display()))?;
    let png = stem.with_extension("png");
    draw_phases(BitMapBackend::new(&png, (1000, h)).into_drawing_area(), title, rows).with_context(|| format!("writing {}", png.display()))?;
    Ok(())
}

/// PARDA host plots (PNG + SVG each) in `dir`: window, latency (each host's device latency and the
/// signal, with script-L dashed), throughput and beta per host over time.
pub fn host_plots(dir: &Path, title: &str, h: &rein_sim::hosts::HostTotals) -> Result<()> {
    let dt = h.interval_s;
    let x = |i: usize| (i as f64 + 0.5) * dt;
    let mut window = Vec::new();
    let mut lat = Vec::new();
    let mut iops = Vec::new();
    let mut beta = Vec::new();
    for (k, name) in h.names.iter().enumerate().take(12) {
        let cells = (0..h.intervals).map(|i| (i, h.cell(k, i)));
        window.push(Series { name: name.clone(), points: cells.clone().map(|(i, c)| (x(i), c.window)).collect() });
        lat.push(Series {
            name: name.clone(),
            points: cells.clone().filter(|(_, c)| c.ios > 0).map(|(i, c)| (x(i), c.lat_sum_ns as f64 / c.ios as f64 / 1e6)).collect(),
        });
        iops.push(Series { name: name.clone(), points: cells.clone().map(|(i, c)| (x(i), c.ios as f64 / dt)).collect() });
        beta.push(Series { name: name.clone(), points: cells.map(|(i, c)| (x(i), c.beta)).collect() });
    }
    // The signal the first PARDA host used (cluster average or its own estimate) and script-L (dashed).
    let dashed = vec![Series { name: "script-L".into(), points: vec![(0.0, h.threshold_ms), (h.intervals as f64 * dt, h.threshold_ms)] }];
    if let Some(k) = h.controlled.iter().position(|&c| c) {
        lat.push(Series {
            name: format!("signal ({})", h.names[k]),
            points: (0..h.intervals).map(|i| (x(i), h.cell(k, i).signal_ns / 1e6)).filter(|p| p.1 > 0.0).collect(),
        });
    }
    line_chart(&dir.join("host-window"), &format!("{title}: window per host"), "time (s)", "window (IOs)", &window, &[])?;
    line_chart(&dir.join("host-latency"), &format!("{title}: device latency per host"), "time (s)", "latency (ms)", &lat, &dashed)?;
    line_chart(&dir.join("host-iops"), &format!("{title}: throughput per host"), "time (s)", "IOPS", &iops, &[])?;
    line_chart(&dir.join("host-beta"), &format!("{title}: beta per host"), "time (s)", "beta", &beta, &[])?;
    Ok(())
}

/// The standard plots of a run: iops, latency, phases (PNG + SVG each) in `dir`.
pub fn run_plots(dir: &Path, title: &str, ts: &Timeseries, phase_rows: &[(String, [f64; 3])]) -> Result<()> {
    let dt = ts.interval_s;
    let mut iops = Vec::new();
    let mut lat = Vec::new();
    for (ti, name) in ts.tenant_names.iter().enumerate() {
        let mut p = Vec::with_capacity(ts.intervals);
        let mut l = Vec::with_capacity(ts.intervals);
        for i in 0..ts.intervals {
            let c = ts.cell(ti, i);
            let x = (i as f64 + 0.5) * dt;
            p.push((x, c.ios as f64 / dt));
            if c.ios > 0 {
                l.push((x, c.lat_sum_ns as f64 / c.ios as f64 / 1e6));
            }
        }
        iops.push(Series { name: name.clone(), points: p });
        lat.push(Series { name: name.clone(), points: l });
    }
    // Too many lines make an unreadable legend: plot the first 12 tenants.
    iops.truncate(12);
    lat.truncate(12);
    let cap: Vec<Series> = ts
        .server_names
        .iter()
        .zip(&ts.capacity)
        .take(4)
        .map(|(n, c)| Series { name: format!("{n} capacity"), points: c.iter().enumerate().map(|(i, v)| ((i as f64 + 0.5) * dt, *v)).collect() })
        .collect();
    line_chart(&dir.join("iops"), &format!("{title}: IOPS per tenant"), "time (s)", "IOPS", &iops, &cap)?;
    line_chart(&dir.join("latency"), &format!("{title}: mean latency per tenant"), "time (s)", "latency (ms)", &lat, &[])?;
    if phase_rows.iter().any(|r| r.1.iter().any(|&x| x > 0.0)) {
        phase_chart(&dir.join("phases"), &format!("{title}: IOs by scheduling phase"), phase_rows)?;
    }
    Ok(())
}
