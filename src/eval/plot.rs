//! The two kinds of chart `seeker report` draws ([`super::report`]): grouped
//! bars and lines, as SVG strings, with `plotters`' SVG backend: the plot on
//! the left (560 px), its legend beside it (never over the data), sans-serif
//! text as SVG `<text>`, each series in its run's colour ([`color`]) in every
//! plot.

use plotters::prelude::*;

use super::report::ReportError;

/// Width of the whole chart and of its plot area; the legend takes the rest.
const WIDTH: u32 = 820;
const PLOT_WIDTH: u32 = 580;
/// Height of a chart with up to [`LEGEND_ROWS`] series; more make it taller.
const HEIGHT: u32 = 380;
const LEGEND_ROWS: u32 = 17;
const ROW: u32 = 20;
const FONT: &str = "sans-serif";

/// Strong, distinguishable colours: Tableau 10, then ten darker ones. A
/// report of more runs repeats them (and says so in its legend order).
const PALETTE: [(u8, u8, u8); 20] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
    (0, 63, 92),
    (122, 81, 149),
    (239, 86, 117),
    (0, 128, 96),
    (166, 86, 40),
    (77, 77, 77),
    (0, 0, 160),
    (160, 0, 80),
    (96, 128, 0),
    (200, 120, 0),
];

/// The colour of run `i` (the same in every plot of a report).
pub(super) fn color(i: usize) -> RGBColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

fn draw_error<E: std::fmt::Debug>(plot: &'static str) -> impl Fn(E) -> ReportError {
    move |e| ReportError::Draw {
        plot,
        message: format!("{e:?}"),
    }
}

/// A series: its run's index (its colour), its name, its values.
pub(super) struct Series<T> {
    /// The run's index in the report (its colour).
    pub run: usize,
    /// The legend's name.
    pub name: String,
    /// Bars (one value per group) or points.
    pub values: T,
}

/// The chart's height for `n` legend rows.
fn height(n: usize) -> u32 {
    HEIGHT
        .max(60 + ROW * n as u32)
        .max(HEIGHT + ROW * (n as u32).saturating_sub(LEGEND_ROWS))
}

/// Draws the legend (a swatch and a name per series, names cut at 36
/// characters) into `area`.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(usize, &str)],
    line: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (row, (run, name)) in entries.iter().enumerate() {
        let y = 48 + ROW as i32 * row as i32;
        let c = color(*run);
        if line {
            area.draw(&PathElement::new([(8, y), (26, y)], c.stroke_width(3)))?;
        } else {
            area.draw(&Rectangle::new([(10, y - 6), (24, y + 6)], c.filled()))?;
        }
        let shown = match name.char_indices().nth(36) {
            Some((at, _)) => format!("{}…", &name[..at]),
            None => (*name).to_string(),
        };
        area.draw(&Text::new(shown, (32, y - 7), (FONT, 13).into_font()))?;
    }
    Ok(())
}

/// Grouped bars: `groups` along the x axis, one bar per series in each;
/// values in 0..=`top`. A value of exactly 0 is a short bar-wide line on
/// the axis (so it reads as 0, not as missing); `None` draws nothing.
pub(super) fn grouped_bars(
    plot: &'static str,
    caption: &str,
    y_desc: &str,
    groups: &[String],
    series: &[Series<Vec<Option<f64>>>],
    top: f64,
) -> Result<String, ReportError> {
    let err = draw_error(plot);
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, height(series.len()))).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let (left, right) = root.split_horizontally(PLOT_WIDTH);
        let n = groups.len().max(1) as f64;
        let mut chart = ChartBuilder::on(&left)
            .caption(caption, (FONT, 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..top)
            .map_err(&err)?;
        let labels = groups.to_vec();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(groups.len().max(1))
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    labels.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc(y_desc)
            .label_style((FONT, 13))
            .draw()
            .map_err(&err)?;
        let width = 0.8 / series.len().max(1) as f64;
        for (s, one) in series.iter().enumerate() {
            let c = color(one.run);
            let x0 = |g: usize| g as f64 - 0.4 + s as f64 * width;
            let bars = one.values.iter().enumerate().filter_map(|(g, v)| {
                let v = (*v)?;
                (v > 0.0).then(|| {
                    Rectangle::new(
                        [(x0(g), 0.0), (x0(g) + width * 0.9, v.min(top))],
                        c.filled(),
                    )
                })
            });
            chart.draw_series(bars).map_err(&err)?;
            let zeros = one
                .values
                .iter()
                .enumerate()
                .filter(|(_, v)| **v == Some(0.0))
                .map(|(g, _)| {
                    PathElement::new(
                        [(x0(g), 0.0), (x0(g) + width * 0.9, 0.0)],
                        c.stroke_width(4),
                    )
                });
            chart.draw_series(zeros).map_err(&err)?;
        }
        let entries: Vec<(usize, &str)> = series.iter().map(|s| (s.run, s.name.as_str())).collect();
        legend(&right, &entries, false).map_err(&err)?;
        root.present().map_err(&err)?;
    }
    Ok(svg)
}

/// How [`lines`] draws its series: markers on the points, x labels at
/// whole numbers only.
pub(super) struct LineStyle {
    pub markers: bool,
    pub whole_x: bool,
}

/// Lines: one per series of (x, y) points.
pub(super) fn lines(
    plot: &'static str,
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[Series<Vec<(f64, f64)>>],
    (x_range, y_range): (std::ops::Range<f64>, std::ops::Range<f64>),
    style: LineStyle,
) -> Result<String, ReportError> {
    let err = draw_error(plot);
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, height(series.len()))).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let (left, right) = root.split_horizontally(PLOT_WIDTH);
        let span = x_range.end - x_range.start;
        let mut chart = ChartBuilder::on(&left)
            .caption(caption, (FONT, 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(x_range, y_range)
            .map_err(&err)?;
        let whole_x = style.whole_x;
        let x_ticks = if whole_x {
            (span as usize + 1).clamp(2, 12)
        } else {
            10
        };
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(x_ticks)
            .x_label_formatter(&|x| {
                if !whole_x {
                    format!("{x:.0}")
                } else if (x - x.round()).abs() < 1e-6 {
                    format!("{:.0}", x.round())
                } else {
                    String::new()
                }
            })
            .label_style((FONT, 13))
            .draw()
            .map_err(&err)?;
        for one in series {
            let c = color(one.run);
            chart
                .draw_series(LineSeries::new(
                    one.values.iter().copied(),
                    c.stroke_width(2),
                ))
                .map_err(&err)?;
            if style.markers {
                chart
                    .draw_series(one.values.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(&err)?;
            }
        }
        let entries: Vec<(usize, &str)> = series.iter().map(|s| (s.run, s.name.as_str())).collect();
        legend(&right, &entries, true).map_err(&err)?;
        root.present().map_err(&err)?;
    }
    Ok(svg)
}
