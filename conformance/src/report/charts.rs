//! The report's charts: horizontal bars on a logarithmic axis (backends differ by orders of
//! magnitude: memory's sub-microsecond bar must stay visible next to ZooKeeper's milliseconds),
//! as inline SVG.

use std::fmt::Write as _;

use crate::escape::html_escape as esc;

/// One bar series: its CSS class and legend label.
pub(crate) struct Series {
    pub class: &'static str,
    pub label: &'static str,
}

/// A horizontal bar chart on a log10 axis. `rows` are (label, one value per series, or `None`
/// when not measured); values that are not finite and positive show as "n/a".
pub(crate) fn log_bar_chart(
    title: &str,
    unit: &str,
    series: &[Series],
    rows: &[(String, Option<Vec<Option<f64>>>)],
) -> String {
    const LEFT: f64 = 170.0;
    const PLOT: f64 = 560.0;
    const RIGHT: f64 = 130.0;
    const BAR: f64 = 14.0;
    /// The legend's line, under the title's.
    const LEGEND_Y: f64 = 24.0;
    const TOP: f64 = 48.0;
    const AXIS: f64 = 40.0;
    let group = series.len() as f64 * BAR + 16.0;
    let values: Vec<f64> = rows
        .iter()
        .filter_map(|(_, v)| v.as_ref())
        .flatten()
        .flatten()
        .copied()
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    if values.is_empty() {
        return format!(
            "<p class=\"unknown\">{}: nothing was measured.</p>",
            esc(title)
        );
    }
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0_f64, f64::max);
    // Whole decades around the data; at least one decade wide.
    let lo_exp = lo.log10().floor() as i32;
    let hi_exp = (hi.log10().ceil() as i32).max(lo_exp + 1);
    let span = f64::from(hi_exp - lo_exp);
    let x = |v: f64| LEFT + ((v.log10() - f64::from(lo_exp)) / span).clamp(0.0, 1.0) * PLOT;
    let height = TOP + rows.len() as f64 * group + AXIS;
    let width = LEFT + PLOT + RIGHT;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<figure class=\"chart\"><svg xmlns=\"http://www.w3.org/2000/svg\" \
         viewBox=\"0 0 {width} {height}\" width=\"{width}\" height=\"{height}\" role=\"img\" \
         aria-label=\"{t} ({u}, logarithmic scale)\">\
         <text x=\"{LEFT}\" y=\"16\" class=\"title\">{t} ({u}, log scale)</text>",
        t = esc(title),
        u = esc(unit)
    );
    // Legend on its own line under the title (sharing the title's line, a long title ran
    // into it), left-aligned with the plot.
    let mut lx = LEFT;
    for se in series {
        let _ = write!(
            s,
            "<rect x=\"{lx:.1}\" y=\"{LEGEND_Y}\" width=\"12\" height=\"10\" class=\"{}\"/>\
             <text x=\"{tx:.1}\" y=\"{ty}\" class=\"key\">{}</text>",
            se.class,
            esc(se.label),
            tx = lx + 16.0,
            ty = LEGEND_Y + 9.0
        );
        lx += 16.0 + 7.0 * se.label.len() as f64 + 16.0;
    }
    let axis_y = TOP + rows.len() as f64 * group;
    for e in lo_exp..=hi_exp {
        let v = 10f64.powi(e);
        let tx = x(v);
        let _ = writeln!(
            s,
            "<line x1=\"{tx:.1}\" y1=\"{TOP}\" x2=\"{tx:.1}\" y2=\"{axis_y}\" class=\"grid\"/>\
             <text x=\"{tx:.1}\" y=\"{ty}\" class=\"tick\">{}</text>",
            tick(v),
            ty = axis_y + 16.0
        );
    }
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{axis_y}\" x2=\"{end}\" y2=\"{axis_y}\" class=\"axis\"/>\
         <text x=\"{mid}\" y=\"{ly}\" class=\"axislabel\">{} (logarithmic: each grid line is 10x)</text>",
        esc(unit),
        end = LEFT + PLOT,
        mid = LEFT + PLOT / 2.0,
        ly = axis_y + 34.0
    );
    for (i, (label, vals)) in rows.iter().enumerate() {
        let y0 = TOP + i as f64 * group + 8.0;
        let _ = writeln!(
            s,
            "<text x=\"{lx}\" y=\"{ly:.1}\" class=\"name\">{}</text>",
            esc(&short(label, 22)),
            lx = LEFT - 10.0,
            ly = y0 + BAR * series.len() as f64 / 2.0 + 4.0
        );
        let Some(vals) = vals else {
            let _ = writeln!(
                s,
                "<text x=\"{tx}\" y=\"{ty:.1}\" class=\"missing\">not measured</text>",
                tx = LEFT + 6.0,
                ty = y0 + BAR + 4.0
            );
            continue;
        };
        for (j, se) in series.iter().enumerate() {
            let y = y0 + j as f64 * BAR;
            match vals
                .get(j)
                .copied()
                .flatten()
                .filter(|v| v.is_finite() && *v > 0.0)
            {
                Some(v) => {
                    // Even the smallest value keeps a visible stub.
                    let bw = (x(v) - LEFT).max(3.0);
                    let _ = writeln!(
                        s,
                        "<rect x=\"{LEFT}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{bh}\" class=\"{c}\">\
                         <title>{l} {sl}: {v}</title></rect>\
                         <text x=\"{tx:.1}\" y=\"{ty:.1}\" class=\"val\">{sl} {v}</text>",
                        c = se.class,
                        l = esc(label),
                        sl = esc(se.label),
                        v = value(v),
                        bh = BAR - 2.0,
                        tx = LEFT + bw + 5.0,
                        ty = y + BAR - 4.0,
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "<text x=\"{tx}\" y=\"{ty:.1}\" class=\"missing\">{} n/a</text>",
                        esc(se.label),
                        tx = LEFT + 6.0,
                        ty = y + BAR - 4.0
                    );
                }
            }
        }
    }
    let _ = writeln!(s, "</svg></figure>");
    s
}

/// A decade tick: `0.1`, `1`, `10`, `1k`, `10k`, `1M`.
fn tick(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

/// A bar's value, three significant digits or whole numbers.
fn value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_scale_keeps_tiny_bars_visible_and_marks_missing() {
        let rows = vec![
            ("memory".to_owned(), Some(vec![Some(0.6), Some(1.1)])),
            ("zk".to_owned(), Some(vec![Some(2173.0), None])),
            ("<b>".to_owned(), None),
        ];
        let svg = log_bar_chart(
            "Latency",
            "µs",
            &[
                Series {
                    class: "p50",
                    label: "p50",
                },
                Series {
                    class: "p99",
                    label: "p99",
                },
            ],
            &rows,
        );
        // Decades from 0.1 to 10k; memory's bar is wider than a stub.
        assert!(svg.contains(">0.1<") && svg.contains(">10k<"), "{svg}");
        assert!(svg.contains("p50 0.60"), "{svg}");
        assert!(svg.contains("p99 n/a"), "{svg}");
        assert!(svg.contains("not measured"));
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"));
        let memory_bar = svg
            .split("<rect")
            .find(|r| r.contains("memory p50"))
            .unwrap();
        let width: f64 = memory_bar
            .split("width=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(width > 50.0, "memory's bar is visible: {width}");
        assert!(log_bar_chart("x", "u", &[], &[]).contains("nothing was measured"));
    }

    /// The legend sits on its own line under the title, so a long title cannot run into it.
    #[test]
    fn legend_is_under_the_title_not_beside_it() {
        let svg = log_bar_chart(
            "Hand-over rate with four contending holders, library and process hand-overs",
            "hand-overs/s",
            &[
                Series {
                    class: "p50",
                    label: "library",
                },
                Series {
                    class: "p99",
                    label: "process",
                },
            ],
            &[("redis".to_owned(), Some(vec![Some(4308.0), Some(120.0)]))],
        );
        let title_y = 16.0;
        let key_ys: Vec<f64> = svg
            .split("<text ")
            .filter(|t| t.contains("class=\"key\""))
            .map(|t| {
                t.split("y=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert_eq!(key_ys.len(), 2, "{svg}");
        // Below the title's baseline by more than a line of 12 px text, above the first bar.
        assert!(
            key_ys.iter().all(|y| *y >= title_y + 12.0 && *y < 48.0),
            "{key_ys:?}"
        );
    }
}
