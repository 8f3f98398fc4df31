//! PNG plots of a figure against the object count, one line per variant (log-log axes).

use std::{collections::BTreeMap, path::Path};

use anyhow::Context as _;
use plotters::prelude::*;

/// Makes `path` (or the system's sans-serif font, found with `fc-match`) the font of the plots.
pub(crate) fn register_font(path: Option<&Path>) -> anyhow::Result<()> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => {
            let found = std::process::Command::new("fc-match")
                .args(["--format=%{file}", "sans-serif"])
                .output()
                .context("no font given (--font) and fc-match could not be run")?;
            String::from_utf8(found.stdout)
                .context("fc-match printed no path")?
                .into()
        }
    };
    let bytes =
        std::fs::read(&path).with_context(|| format!("cannot read font {}", path.display()))?;
    // plotters keeps registered fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{} is not a TrueType font", path.display()))
}

/// `1k`, `10k`, `100k`... for the object counts the benchmarks use; nothing in between, so the
/// labels of a log axis do not crowd.
fn power_of_ten(x: f64) -> Option<String> {
    let exponent = x.log10().round();
    if (x.log10() - exponent).abs() > 1e-9 || exponent < 0.0 {
        return None;
    }
    #[allow(clippy::cast_possible_truncation)]
    Some(match exponent as i32 {
        e @ 0..=2 => format!("{}", 10_i32.pow(e.unsigned_abs())),
        e @ 3..=5 => format!("{}k", 10_i32.pow((e - 3).unsigned_abs())),
        e => format!("{}M", 10_i32.pow((e - 6).unsigned_abs())),
    })
}

fn drawing_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("cannot draw the plot: {e}")
}

/// Draws `series` (x, value) to `path`: x is the object count, or with `x_label` "controllers"
/// the number of controllers. Returns false, and writes no file, when there is nothing to draw
/// (no point, or none above zero on the log scale).
pub(crate) fn draw(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &BTreeMap<String, Vec<(usize, f64)>>,
) -> anyhow::Result<bool> {
    let points = || series.values().flatten();
    let (Some(x_min), Some(x_max)) = (
        points().map(|(n, _)| *n as f64).reduce(f64::min),
        points().map(|(n, _)| *n as f64).reduce(f64::max),
    ) else {
        return Ok(false);
    };
    let y_min = points()
        .map(|(_, y)| *y)
        .filter(|y| *y > 0.0)
        .fold(f64::INFINITY, f64::min);
    let y_max = points().map(|(_, y)| *y).fold(0.0, f64::max);
    if !y_min.is_finite() {
        return Ok(false);
    }
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(drawing_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            (x_min / 1.5..x_max * 1.5).log_scale(),
            (y_min / 2.0..y_max * 2.0).log_scale(),
        )
        .map_err(drawing_error)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| {
            if x_label == "objects" {
                power_of_ten(*x).unwrap_or_default()
            } else if (x - x.round()).abs() < 0.05 {
                format!("{}", x.round())
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y}"))
        .label_style(("sans-serif", 15))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(drawing_error)?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line = points.iter().map(|(n, y)| (*n as f64, *y));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(3)))
            .map_err(drawing_error)?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        chart
            .draw_series(
                points
                    .iter()
                    .map(|(n, y)| Circle::new((*n as f64, *y), 5, color.filled())),
            )
            .map_err(drawing_error)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 18))
        .draw()
        .map_err(drawing_error)?;
    root.present().map_err(drawing_error)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_powers_of_ten_are_labelled() {
        assert_eq!(super::power_of_ten(1000.0).as_deref(), Some("1k"));
        assert_eq!(super::power_of_ten(100_000.0).as_deref(), Some("100k"));
        assert_eq!(super::power_of_ten(100.0).as_deref(), Some("100"));
        assert_eq!(super::power_of_ten(2000.0), None);
        assert_eq!(super::power_of_ten(9000.0), None);
    }
}
