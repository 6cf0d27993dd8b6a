//! The two kinds of chart `seeker report` draws ([`super::report`]): grouped
//! bars and lines, as SVG strings, with `plotters`' SVG backend (760 × 380,
//! sans-serif text as SVG `<text>`, series colours from `Palette99`, the
//! legend in a corner).

use plotters::prelude::*;

use super::report::ReportError;

const WIDTH: u32 = 760;
const HEIGHT: u32 = 380;
const FONT: &str = "sans-serif";

fn draw_error<E: std::fmt::Debug>(plot: &'static str) -> impl Fn(E) -> ReportError {
    move |e| ReportError::Draw {
        plot,
        message: format!("{e:?}"),
    }
}

/// Grouped bars: `groups` along the x axis, one bar per series in each,
/// series colours in the legend; values in 0..=`top`.
pub(super) fn grouped_bars(
    plot: &'static str,
    caption: &str,
    y_desc: &str,
    groups: &[String],
    series: &[(String, Vec<Option<f64>>)],
    top: f64,
) -> Result<String, ReportError> {
    let err = draw_error(plot);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let n = groups.len().max(1) as f64;
        let mut chart = ChartBuilder::on(&root)
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
        for (s, (name, values)) in series.iter().enumerate() {
            let color = Palette99::pick(s).to_rgba();
            let bars = values.iter().enumerate().filter_map(|(g, v)| {
                let v = (*v)?;
                let x0 = g as f64 - 0.4 + s as f64 * width;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + width * 0.9, v.min(top))],
                    color.filled(),
                ))
            });
            chart
                .draw_series(bars)
                .map_err(&err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FONT, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(&err)?;
        root.present().map_err(&err)?;
    }
    Ok(svg)
}

/// How [`lines`] draws its series: markers on the points, x labels at
/// whole numbers only, where the legend goes.
pub(super) struct LineStyle {
    pub markers: bool,
    pub whole_x: bool,
    pub legend: SeriesLabelPosition,
}

/// Lines: one per series of (x, y) points.
pub(super) fn lines(
    plot: &'static str,
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    (x_range, y_range): (std::ops::Range<f64>, std::ops::Range<f64>),
    style: LineStyle,
) -> Result<String, ReportError> {
    let err = draw_error(plot);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, (FONT, 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(x_range, y_range)
            .map_err(&err)?;
        let whole_x = style.whole_x;
        let x_ticks = if whole_x {
            (x_range_len(&chart) as usize + 1).clamp(2, 12)
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
        for (s, (name, points)) in series.iter().enumerate() {
            let color = Palette99::pick(s).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(&err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2))
                });
            if style.markers {
                chart
                    .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
                    .map_err(&err)?;
            }
        }
        chart
            .configure_series_labels()
            .position(style.legend)
            .label_font((FONT, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(&err)?;
        root.present().map_err(&err)?;
    }
    Ok(svg)
}

/// The width of a chart's x range.
fn x_range_len<DB: DrawingBackend>(
    chart: &ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
) -> f64 {
    let r = chart.x_range();
    r.end - r.start
}
