//! Plots (PNG and SVG) of simulated and measured runs: IOPS and latency over time per tenant, and the
//! split of each tenant's IOs between the reservation and weight phases.
//!
//! Text layout needs a TrueType font; we load DejaVu Sans (Debian's fonts-dejavu-core) or another common
//! sans font from the system. Without one, plots are skipped with a warning (the data files are still
//! written).

use crate::out::OutDir;
use anyhow::{Context, Result};
use plotters::prelude::*;
use rein_sim::Timeseries;
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
pub(crate) struct NoFont(String);

/// Whether plots can be drawn; if not, why ([`NoFont`]).
pub(crate) fn need_font() -> Result<()> {
    if font_ready() {
        Ok(())
    } else {
        Err(NoFont(FONT_CANDIDATES.join(", ")).into())
    }
}

/// One line of a line chart.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
}

/// Draws one chart twice, as `<stem>.svg` and `<stem>.png` at `size` pixels, into `out`:
/// `draw(root, args...)`. Each is drawn in memory and written whole ([`OutDir::write`]).
macro_rules! svg_and_png {
    ($out:expr, $stem:expr, $size:expr, $draw:ident($($arg:expr),* $(,)?)) => {{
        need_font()?;
        let [svg_name, png_name] = crate::out::plot_files($stem);
        let mut svg = String::new();
        $draw(SVGBackend::with_string(&mut svg, $size).into_drawing_area(), $($arg),*)
            .with_context(|| format!("drawing {}", $out.path().join(&svg_name).display()))?;
        $out.write(&svg_name, svg.as_bytes())?;
        drop(svg);
        let (w, h) = $size;
        let mut pixels = vec![0u8; w as usize * h as usize * 3];
        $draw(BitMapBackend::with_buffer(&mut pixels, $size).into_drawing_area(), $($arg),*)
            .with_context(|| format!("drawing {}", $out.path().join(&png_name).display()))?;
        $out.write(&png_name, &png(&pixels, w, h)?)?;
    }};
}

/// A drawing's error in its Display form (in memory, the backends fail only on a layout or a font).
fn plot_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// An RGB image as PNG (what plotters' file backend writes, the same encoder and settings).
fn png(pixels: &[u8], w: u32, h: u32) -> Result<Vec<u8>> {
    use image::ImageEncoder;
    let mut bytes = Vec::new();
    image::codecs::png::PngEncoder::new(&mut bytes)
        .write_image(pixels, w, h, image::ColorType::Rgb8)
        .map_err(|e| anyhow::anyhow!("encoding PNG: {e}"))?;
    Ok(bytes)
}

/// A legend sample for a line series: a short stroke of `color`.
fn legend_line(color: RGBColor, width: u32) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width))
}

/// Draws the legend box (every chart's style) at `position` and presents the drawing.
fn finish<'a, DB, CT>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
    font: u32,
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", font))
        .position(position)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
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

fn draw_lines<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    dashed: &[Series],
    shadows: &[Shadow],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let all = series.iter().chain(dashed.iter()).chain(shadows.iter().map(|s| &s.series)).flat_map(|s| s.points.iter());
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
        .map_err(plot_err)?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).label_style(("sans-serif", 14)).draw().map_err(plot_err)?;
    for (i, s) in series.iter().enumerate() {
        let c = palette(i);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
            .map_err(plot_err)?
            .label(s.name.clone())
            .legend(legend_line(c, 2));
    }
    for s in shadows {
        let c = palette(s.of);
        chart
            .draw_series(DashedLineSeries::new(s.series.points.iter().copied(), 3, 3, c.stroke_width(1)))
            .map_err(plot_err)?
            .label(s.series.name.clone())
            .legend(legend_line(c, 1));
    }
    for s in dashed {
        let c = RGBColor(90, 90, 90);
        chart
            .draw_series(DashedLineSeries::new(s.points.iter().copied(), 6, 4, c.stroke_width(1)))
            .map_err(plot_err)?
            .label(s.name.clone())
            .legend(legend_line(c, 1));
    }
    finish(&root, &mut chart, SeriesLabelPosition::UpperRight, 14)
}

/// Writes `<stem>.svg` and `<stem>.png` into `out`.
pub(crate) fn line_chart(
    out: &mut OutDir,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    dashed: &[Series],
) -> Result<()> {
    svg_and_png!(out, stem, (1000, 560), draw_lines(title, x_label, y_label, series, dashed, &[]));
    Ok(())
}

/// A line that belongs to `series[of]` of a chart: drawn in its colour, thin and dotted
/// (a tenant's offered load beside what it got).
pub(crate) struct Shadow {
    pub(crate) of: usize,
    pub(crate) series: Series,
}

fn draw_phases<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    rows: &[(String, [f64; 3])],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let n = rows.len().max(1);
    let max = rows.iter().map(|r| r.1.iter().sum::<f64>()).fold(1e-9, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(110)
        .build_cartesian_2d(0f64..max * 1.05, (0..n).into_segmented())
        .map_err(plot_err)?;
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
        .map_err(plot_err)?;
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
            .map_err(plot_err)?
            .label(labels[p])
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    finish(&root, &mut chart, SeriesLabelPosition::LowerRight, 14)
}

/// Horizontal stacked bars: per tenant, IOPS by phase.
pub(crate) fn phase_chart(out: &mut OutDir, stem: &str, title: &str, rows: &[(String, [f64; 3])]) -> Result<()> {
    let h = (120 + 40 * rows.len()).clamp(240, 1400) as u32;
    svg_and_png!(out, stem, (1000, h), draw_phases(title, rows));
    Ok(())
}

/// The plots [`host_plots`] draws.
pub(crate) const HOST_PLOTS: [&str; 4] = ["host-window", "host-latency", "host-iops", "host-beta"];

/// PARDA host plots (PNG + SVG each, [`HOST_PLOTS`]) into `out`: window, latency (each host's device latency and the
/// signal, with script-L dashed), throughput and beta per host over time.
pub(crate) fn host_plots(out: &mut OutDir, title: &str, h: &rein_model::report::hosts::HostTotals) -> Result<()> {
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
            points: cells
                .clone()
                .filter(|(_, c)| c.ios > 0)
                .map(|(i, c)| (x(i), c.lat_sum_ns as f64 / c.ios as f64 / 1e6))
                .collect(),
        });
        iops.push(Series {
            name: name.clone(),
            points: cells.clone().map(|(i, c)| (x(i), c.ios as f64 / h.interval_len(i))).collect(),
        });
        beta.push(Series { name: name.clone(), points: cells.map(|(i, c)| (x(i), c.beta)).collect() });
    }
    // The signal the first PARDA host used (cluster average or its own estimate) and script-L (dashed).
    let dashed = vec![Series {
        name: "script-L".into(),
        points: vec![(0.0, h.threshold_ms), (h.intervals as f64 * dt, h.threshold_ms)],
    }];
    if let Some(k) = h.controlled.iter().position(|&c| c) {
        lat.push(Series {
            name: format!("signal ({})", h.names[k]),
            points: (0..h.intervals).map(|i| (x(i), h.cell(k, i).signal_ns / 1e6)).filter(|p| p.1 > 0.0).collect(),
        });
    }
    line_chart(out, "host-window", &format!("{title}: window per host"), "time (s)", "window (IOs)", &window, &[])?;
    line_chart(
        out,
        "host-latency",
        &format!("{title}: device latency per host"),
        "time (s)",
        "latency (ms)",
        &lat,
        &dashed,
    )?;
    line_chart(out, "host-iops", &format!("{title}: throughput per host"), "time (s)", "IOPS", &iops, &[])?;
    line_chart(out, "host-beta", &format!("{title}: beta per host"), "time (s)", "beta", &beta, &[])?;
    Ok(())
}

/// The plots [`run_plots`] draws: iops, latency, and phases when some tenant has IOs by phase.
pub(crate) fn run_plot_names(phase_rows: &[(String, [f64; 3])]) -> Vec<&'static str> {
    let mut v = vec!["iops", "latency"];
    if phase_rows.iter().any(|r| r.1.iter().any(|&x| x > 0.0)) {
        v.push("phases");
    }
    v
}

/// The standard plots of a run (PNG + SVG each, [`run_plot_names`]) into `out`.
pub(crate) fn run_plots(
    out: &mut OutDir,
    title: &str,
    ts: &Timeseries,
    open_loop: &[bool],
    phase_rows: &[(String, [f64; 3])],
) -> Result<()> {
    let dt = ts.interval_s;
    let mut iops = Vec::new();
    let mut lat = Vec::new();
    let mut offered = Vec::new();
    // Too many lines make an unreadable legend: plot the first 12 tenants.
    for (ti, name) in ts.tenant_names.iter().enumerate().take(12) {
        let mut p = Vec::with_capacity(ts.intervals);
        let mut l = Vec::with_capacity(ts.intervals);
        for i in 0..ts.intervals {
            let c = ts.cell(ti, i);
            let x = (i as f64 + 0.5) * dt;
            p.push((x, c.ios as f64 / ts.interval_len(i)));
            if c.ios > 0 {
                l.push((x, c.lat_sum_ns as f64 / c.ios as f64 / 1e6));
            }
        }
        // An open loop's arrivals are what it asked for: beside its IOPS, they show where it was held back.
        if open_loop.get(ti).copied().unwrap_or(false) {
            let points =
                (0..ts.intervals).map(|i| ((i as f64 + 0.5) * dt, ts.cell(ti, i).arrivals as f64 / ts.interval_len(i)));
            offered
                .push(Shadow { of: ti, series: Series { name: format!("{name} offered"), points: points.collect() } });
        }
        iops.push(Series { name: name.clone(), points: p });
        lat.push(Series { name: name.clone(), points: l });
    }
    let cap: Vec<Series> = ts
        .server_names
        .iter()
        .zip(&ts.capacity)
        // A server whose capacity is unknown (a daemon without a device model) has no line, nor a legend.
        .filter(|(_, c)| !c.is_empty())
        .take(4)
        .map(|(n, c)| Series {
            name: format!("{n} capacity"),
            points: c.iter().enumerate().map(|(i, v)| ((i as f64 + 0.5) * dt, *v)).collect(),
        })
        .collect();
    let iops_title = format!("{title}: IOPS per tenant");
    svg_and_png!(out, "iops", (1000, 560), draw_lines(&iops_title, "time (s)", "IOPS", &iops, &cap, &offered));
    line_chart(out, "latency", &format!("{title}: mean latency per tenant"), "time (s)", "latency (ms)", &lat, &[])?;
    if run_plot_names(phase_rows).contains(&"phases") {
        phase_chart(out, "phases", &format!("{title}: IOs by scheduling phase"), phase_rows)?;
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------------
// pShift: IOs per redistribution interval per bucket (Fig. 3(c)) and cumulative IOs per QoS period
// (Figs. 8-9)
// ------------------------------------------------------------------------------------------------------

/// One bucket's bar: IOs in each redistribution interval of a QoS period, and its reservation for the
/// period.
pub(crate) struct IntervalBar {
    pub(crate) name: String,
    pub(crate) ios: Vec<f64>,
    pub(crate) reservation: f64,
}

fn draw_interval_bars<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    bars: &[IntervalBar],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let n = bars.len().max(1);
    let max = bars.iter().map(|b| b.ios.iter().sum::<f64>().max(b.reservation)).fold(1e-9, f64::max);
    let k = bars.iter().map(|b| b.ios.len()).max().unwrap_or(0);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..n as f64, 0f64..max * 1.08)
        .map_err(plot_err)?;
    let names: Vec<String> = bars.iter().map(|b| b.name.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("bucket (sample, by reservation)")
        .y_desc("IOs in the QoS period")
        .x_labels(n.min(12))
        .x_label_formatter(&|x: &f64| names.get(*x as usize).cloned().unwrap_or_default())
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(plot_err)?;
    for p in 0..k {
        let c = palette(p);
        chart
            .draw_series(bars.iter().enumerate().map(|(i, b)| {
                let start: f64 = b.ios[..p.min(b.ios.len())].iter().sum();
                let h = b.ios.get(p).copied().unwrap_or(0.0);
                Rectangle::new([(i as f64 + 0.15, start), (i as f64 + 0.85, start + h)], c.mix(0.9).filled())
            }))
            .map_err(plot_err)?
            .label(format!("interval {}", p + 1))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            PathElement::new(
                vec![(i as f64 + 0.05, b.reservation), (i as f64 + 0.95, b.reservation)],
                BLACK.stroke_width(2),
            )
        }))
        .map_err(plot_err)?
        .label("reservation")
        .legend(legend_line(BLACK, 2));
    finish(&root, &mut chart, SeriesLabelPosition::UpperRight, 13)
}

/// Stacked bars: per sampled bucket, IOs in each redistribution interval of one QoS period, with its
/// reservation (pShift Fig. 3(c)).
pub(crate) fn interval_chart(out: &mut OutDir, stem: &str, title: &str, bars: &[IntervalBar]) -> Result<()> {
    svg_and_png!(out, stem, (1200, 560), draw_interval_bars(title, bars));
    Ok(())
}

/// The plots [`pshift_plots`] draws: none without `[pshift]`, else intervals, and periods for up to 12
/// buckets.
pub(crate) fn pshift_plot_names(sc: &rein_sim::Scenario) -> Vec<&'static str> {
    match sc.pshift() {
        None => vec![],
        Some(_) if sc.tenants().len() <= 12 => vec!["intervals", "periods"],
        Some(_) => vec!["intervals"],
    }
}

/// pShift plots of a run: `intervals` (IOs per redistribution interval in the first QoS period, a sample
/// of up to 40 buckets by reservation) and, for up to 12 buckets, `periods` (IOs completed since the start
/// of each QoS period, as in Figs. 8 and 9, with reservations and limits dashed).
// `%` rather than `usize::is_multiple_of`, which needs Rust 1.87 (the workspace declares 1.80).
#[allow(clippy::manual_is_multiple_of)]
pub(crate) fn pshift_plots(out: &mut OutDir, title: &str, sc: &rein_sim::Scenario, ts: &Timeseries) -> Result<()> {
    let Some(ps) = sc.pshift() else { return Ok(()) };
    let dt = ts.interval_s;
    let period = ps.period.as_secs_f64();
    let start = ps.start.as_secs_f64();
    let cells_per_period = (period / dt).round() as usize;
    let first = (start / dt).round() as usize;
    let per_interval = (cells_per_period / ps.intervals as usize).max(1);
    // The sample: buckets by reservation, high to low, every k-th.
    let mut order: Vec<usize> = (0..sc.tenants().len()).collect();
    order.sort_by(|&a, &b| {
        sc.tenants()[b].spec.reservation().total_cmp(&sc.tenants()[a].spec.reservation()).then(a.cmp(&b))
    });
    let step = order.len().div_ceil(40).max(1);
    let bars: Vec<IntervalBar> = order
        .iter()
        .step_by(step)
        .map(|&t| IntervalBar {
            name: ts.tenant_names[t].clone(),
            ios: (0..ps.intervals as usize)
                .map(|k| {
                    (0..per_interval)
                        .map(|c| first + k * per_interval + c)
                        .filter(|&i| i < ts.intervals)
                        .map(|i| ts.cell(t, i).ios as f64)
                        .sum()
                })
                .collect(),
            reservation: sc.tenants()[t].spec.reservation() * period,
        })
        .collect();
    let step_note = if step > 1 { format!(", every {step}th bucket") } else { String::new() };
    interval_chart(
        out,
        "intervals",
        &format!("{title}: IOs per redistribution interval, first QoS period{step_note}"),
        &bars,
    )?;
    if pshift_plot_names(sc).contains(&"periods") {
        let mut buckets = Vec::new();
        for (t, name) in ts.tenant_names.iter().enumerate() {
            let mut segments: Vec<Vec<(f64, f64)>> = Vec::new();
            let mut acc = 0.0;
            for i in first..ts.intervals {
                if (i - first) % cells_per_period == 0 {
                    acc = 0.0;
                    segments.push(vec![(i as f64 * dt, 0.0)]);
                }
                acc += ts.cell(t, i).ios as f64;
                segments.last_mut().expect("pushed at the first cell").push(((i + 1) as f64 * dt, acc));
            }
            buckets.push((name.clone(), segments));
        }
        let mut levels = Vec::new();
        let spec = &sc.tenants()[0].spec;
        if sc.tenants().iter().all(|t| t.spec.reservation() == spec.reservation()) {
            levels.push(("reservation".to_string(), spec.reservation() * period));
            if let Some(l) = spec.limit().filter(|_| sc.tenants().iter().all(|t| t.spec.limit() == spec.limit())) {
                levels.push(("limit".to_string(), l * period));
            }
        }
        let t = format!("{title}: IOs completed in each QoS period");
        svg_and_png!(out, "periods", (1000, 560), draw_periods(&t, &buckets, &levels));
    }
    Ok(())
}

/// A pShift controller's rounds over time: the reservation IOs it still wanted for the period and the
/// R-tokens it could place (a gap is reservation it predicted missing), and the L-tokens placed.
pub(crate) fn rounds_plot(
    out: &mut OutDir,
    title: &str,
    rounds: &[rein_model::report::rounds::ControllerRound],
) -> Result<()> {
    let pick = |f: fn(&rein_model::report::rounds::ControllerRound) -> u64| -> Vec<(f64, f64)> {
        rounds.iter().map(|r| (r.at_s, f(r) as f64)).collect()
    };
    let series = [
        Series { name: "R-tokens placed".into(), points: pick(|r| r.r_phi) },
        Series { name: "L-tokens placed".into(), points: pick(|r| r.l_phi) },
    ];
    let wanted = [Series { name: "reservation IOs still wanted".into(), points: pick(|r| r.wanted) }];
    line_chart(
        out,
        "rounds",
        &format!("{title}: the pShift controller's rounds (boundaries and early rounds)"),
        "time (s)",
        "IOs / tokens for the rest of the period",
        &series,
        &wanted,
    )
}

/// Whether [`period_verdicts_plot`] draws its plot: with closed periods of some bucket.
pub(crate) fn draws_period_verdicts(log: &rein_model::report::rounds::PeriodLog) -> bool {
    !(log.records.is_empty() || log.buckets.is_empty())
}

/// `period-verdicts`: a grid of buckets (rows; every k-th past 40) by closed QoS periods (columns), each
/// cell coloured by how the bucket's IOs in the period, by the servers' counts, stand against its
/// reservation and limit (periods.csv's verdict).
pub(crate) fn period_verdicts_plot(
    out: &mut OutDir,
    title: &str,
    log: &rein_model::report::rounds::PeriodLog,
) -> Result<()> {
    if !draws_period_verdicts(log) {
        return Ok(());
    }
    let step = log.buckets.len().div_ceil(40).max(1);
    let step_note = if step > 1 { format!(", every {step}th bucket") } else { String::new() };
    let t = format!("{title}: each closed QoS period by the servers' counts{step_note}");
    svg_and_png!(out, "period-verdicts", (1000, 620), draw_period_verdicts(&t, log, step));
    Ok(())
}

fn draw_period_verdicts<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    log: &rein_model::report::rounds::PeriodLog,
    step: usize,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    use rein_core::pshift::PeriodVerdict;
    // Met, below the reservation (with the demand for it), above the limit, incomplete (a report missing),
    // below the reservation for want of demand.
    const KINDS: [RGBColor; 5] = [
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(255, 127, 14),
        RGBColor(170, 170, 170),
        RGBColor(152, 223, 138),
    ];
    root.fill(&WHITE).map_err(plot_err)?;
    let rows: Vec<usize> = (0..log.buckets.len()).step_by(step).collect();
    let n = rows.len();
    let (p0, p1) = (log.records[0].period as f64, log.records[log.records.len() - 1].period as f64 + 1.0);
    // Cells are centred on whole numbers (period p, row k), so the axes' whole-number labels name them.
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(p0 - 0.5..p1 - 0.5, -0.5..n as f64 - 0.5)
        .map_err(plot_err)?;
    // Row 0 (the first bucket) at the top.
    let whole = |v: f64| (v.fract().abs() < 1e-9).then_some(v.round() as i64);
    let name = |v: &f64| match whole(*v) {
        Some(r) if (0..n as i64).contains(&r) => log.buckets[rows[n - 1 - r as usize]].0.clone(),
        _ => String::new(),
    };
    let period = |v: &f64| whole(*v).map_or(String::new(), |p| p.to_string());
    chart
        .configure_mesh()
        .disable_mesh()
        // The colours are named here rather than in a legend box, which would hide cells.
        .x_desc(
            "QoS period (green: met; pale green: below the reservation for want of demand; red: below it with the \
             demand; orange: above the limit; grey: incomplete)",
        )
        .y_desc("bucket")
        .y_labels(n)
        .x_labels(((p1 - p0) as usize).min(20))
        .y_label_formatter(&name)
        .x_label_formatter(&period)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(plot_err)?;
    let mut cells = Vec::new();
    for r in &log.records {
        for (k, &b) in rows.iter().enumerate() {
            let Some((c, verdict)) = log.cell(r, b) else { continue };
            let kind = match verdict {
                Some(PeriodVerdict::Met) => 0,
                Some(PeriodVerdict::BelowReservation { with_demand: true }) => 1,
                Some(PeriodVerdict::AboveLimit) => 2,
                None => 3,
                Some(PeriodVerdict::BelowReservation { with_demand: false }) => 4,
            };
            cells.push(((r.period as f64, (n - 1 - k) as f64), KINDS[kind], c));
        }
    }
    let at = |(x, y): (f64, f64)| [(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)];
    let filled = cells.iter().map(|&(xy, color, _)| Rectangle::new(at(xy), color.filled()));
    chart.draw_series(filled).map_err(plot_err)?;
    // White edges between cells while they are wide enough to see, and each cell's IOs while there is room.
    if cells.len() <= 4000 {
        let edges = cells.iter().map(|&(xy, _, _)| Rectangle::new(at(xy), WHITE.stroke_width(1)));
        chart.draw_series(edges).map_err(plot_err)?;
    }
    if n <= 24 && p1 - p0 <= 16.0 {
        use plotters::style::text_anchor::{HPos, Pos, VPos};
        let centred = Pos::new(HPos::Center, VPos::Center);
        let style = TextStyle::from(("sans-serif", 13).into_font()).color(&WHITE).pos(centred);
        let labels = cells.iter().map(|&(xy, _, c)| Text::new(c.to_string(), xy, style.clone()));
        chart.draw_series(labels).map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

type PeriodLines = [(String, Vec<Vec<(f64, f64)>>)];

/// Per bucket, one line per QoS period (IOs since the period began), and dashed levels.
fn draw_periods<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    buckets: &PeriodLines,
    levels: &[(String, f64)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let pts = buckets.iter().flat_map(|b| b.1.iter().flatten());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, 1e-9f64, 1e-9f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    for l in levels {
        y1 = y1.max(l.1);
    }
    let x0 = if x0.is_finite() { x0 } else { 0.0 };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, 0f64..y1 * 1.08)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("IOs since the QoS period began")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(plot_err)?;
    for (i, (name, segs)) in buckets.iter().enumerate() {
        let c = palette(i);
        for (k, seg) in segs.iter().enumerate() {
            let s = chart.draw_series(LineSeries::new(seg.iter().copied(), c.stroke_width(2))).map_err(plot_err)?;
            if k == 0 {
                s.label(name.clone()).legend(legend_line(c, 2));
            }
        }
    }
    for (name, y) in levels {
        let c = RGBColor(90, 90, 90);
        chart
            .draw_series(DashedLineSeries::new(vec![(x0, *y), (x1, *y)], 6, 4, c.stroke_width(1)))
            .map_err(plot_err)?
            .label(name.clone())
            .legend(legend_line(c, 1));
    }
    finish(&root, &mut chart, SeriesLabelPosition::UpperLeft, 14)
}
