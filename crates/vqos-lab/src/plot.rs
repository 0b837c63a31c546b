//! The lab's SVG line plots (`rates.svg` of a run, `cpu.svg` and `latency.svg` of a sweep):
//! one drawing routine for all of them.
//!
//! ## Behavior
//! - Axes start at 0 and end at a round value; ticks fall on round values (1, 2 or 5 × 10^k:
//!   [`nice_ticks`]), labelled with as many decimals as the step needs.
//! - Series are told apart by colour, kinds of line by dash pattern ([`Style`]: measured solid,
//!   simulated dotted, reference dashed), each explained once in the legend.
//! - Phases are marked by a grey vertical line at each phase start after 0, labelled above.
//!
//! Why by hand: a handful of lines, polylines and text elements; the plotting crates lay out
//! text with font metrics, which would need a font file at run time for no better picture.

use std::fmt::Write as _;

/// How a line is drawn (and what that means in the legend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Measured.
    Solid,
    /// Simulated.
    Dotted,
    /// Reference (the allocator's expectation).
    Dashed,
}

impl Style {
    fn dash(self) -> &'static str {
        match self {
            Style::Solid => "",
            Style::Dotted => " stroke-dasharray=\"1 3\"",
            Style::Dashed => " stroke-dasharray=\"6 4\"",
        }
    }
}

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Line {
    /// The series it belongs to (its colour); the first line of a series names it in the legend.
    pub series: usize,
    /// Dash pattern.
    pub style: Style,
    /// Points (x, y), in the plot's units.
    pub points: Vec<(f64, f64)>,
    /// A dot on every point.
    pub markers: bool,
}

/// A line plot.
#[derive(Debug, Clone, Default)]
pub struct Plot {
    /// Title, above the plot.
    pub title: String,
    /// X axis label.
    pub xlabel: String,
    /// Y axis label.
    pub ylabel: String,
    /// Series names, by index (colours in that order).
    pub series: Vec<String>,
    /// The lines.
    pub lines: Vec<Line>,
    /// Phase starts (x) and labels; a start at 0 is not drawn.
    pub phases: Vec<(f64, String)>,
    /// Styles to explain in the legend, with what they mean.
    pub styles: Vec<(Style, String)>,
    /// The x axis ends here (default: the largest x, rounded up to a tick).
    pub x_max: Option<f64>,
}

const COLOURS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// The smallest tick step of 1, 2 or 5 × 10^k that covers `max` in at most `target + 1`
/// intervals, and the axis end: the first multiple of the step at or above `max`. For
/// `max ≤ 0` (or not finite): step 1, end 1.
pub fn nice_ticks(max: f64, target: u32) -> (f64, f64) {
    if !max.is_finite() || max <= 0.0 {
        return (1.0, 1.0);
    }
    let most = f64::from(target.max(1) + 1);
    let mut exp = (max / most).log10().floor() as i32 - 1;
    loop {
        for m in [1.0, 2.0, 5.0] {
            let step = m * 10f64.powi(exp);
            let intervals = (max / step - 1e-9).ceil().max(1.0);
            if intervals <= most {
                return (step, intervals * step);
            }
        }
        exp += 1;
    }
}

/// A tick value with the decimals `step` needs.
fn label(v: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// Escapes text for SVG.
pub fn xml(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Plot {
    /// The SVG document.
    pub fn svg(&self) -> String {
        let (w, h, ml, mr, mt, mb) = (900.0, 420.0, 64.0, 170.0, 40.0, 44.0);
        let points = || self.lines.iter().flat_map(|l| l.points.iter());
        let data_x = points().map(|p| p.0).fold(0.0, f64::max);
        let data_y = points().map(|p| p.1).fold(0.0, f64::max);
        let (ystep, ymax) = nice_ticks(data_y * 1.05, 5);
        let (xstep, xmax) = match self.x_max {
            Some(m) if m > 0.0 => (nice_ticks(m, 8).0, m),
            _ => nice_ticks(data_x, 8),
        };
        let x = |v: f64| ml + (v / xmax).clamp(0.0, 1.0) * (w - ml - mr);
        let y = |v: f64| mt + (1.0 - (v / ymax).clamp(0.0, 1.0)) * (h - mt - mb);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"{w}\" height=\"{h}\" \
             fill=\"white\"/>\n<text x=\"{ml}\" y=\"18\" font-size=\"14\">{}</text>",
            xml(&self.title)
        );
        let mut k = 0.0;
        while k * ystep <= ymax + ystep * 1e-6 {
            let v = k * ystep;
            let _ = writeln!(
                s,
                "<line x1=\"{ml}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e4e4\"/>\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                w - mr,
                ml - 6.0,
                y(v) + 4.0,
                label(v, ystep),
                yy = y(v)
            );
            k += 1.0;
        }
        let mut k = 0.0;
        while k * xstep <= xmax + xstep * 1e-6 {
            let v = k * xstep;
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                x(v),
                h - mb + 16.0,
                label(v, xstep)
            );
            k += 1.0;
        }
        let _ = writeln!(
            s,
            "<path d=\"M{ml} {mt} V{} H{}\" stroke=\"black\" fill=\"none\"/>\n\
             <text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text><text x=\"14\" y=\"{:.1}\" \
             transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">{}</text>",
            h - mb,
            w - mr,
            (ml + w - mr) / 2.0,
            h - 6.0,
            xml(&self.xlabel),
            (mt + h - mb) / 2.0,
            (mt + h - mb) / 2.0,
            xml(&self.ylabel)
        );
        for (start, name) in self.phases.iter().filter(|p| p.0 > 0.0 && p.0 < xmax) {
            let _ = writeln!(
                s,
                "<line class=\"phase\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{mt}\" y2=\"{}\" \
                 stroke=\"#999\" stroke-dasharray=\"2 2\"/><text x=\"{:.1}\" y=\"{}\" \
                 font-size=\"10\" fill=\"#666\">{}</text>",
                h - mb,
                x(*start) + 3.0,
                mt - 4.0,
                xml(name),
                xx = x(*start)
            );
        }
        for line in &self.lines {
            let c = COLOURS[line.series % COLOURS.len()];
            let pts: Vec<String> = line
                .points
                .iter()
                .map(|&(a, b)| format!("{:.1},{:.1}", x(a), y(b)))
                .collect();
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"1.5\"{}/>",
                pts.join(" "),
                line.style.dash()
            );
            if line.markers {
                for &(a, b) in &line.points {
                    let _ = writeln!(
                        s,
                        "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>",
                        x(a),
                        y(b)
                    );
                }
            }
        }
        let entries = self
            .series
            .iter()
            .enumerate()
            .map(|(i, n)| (COLOURS[i % COLOURS.len()], Style::Solid, n.as_str()))
            .chain(self.styles.iter().map(|(st, n)| ("black", *st, n.as_str())));
        for (i, (c, st, name)) in entries.enumerate() {
            let ly = mt + 10.0 + 18.0 * i as f64;
            let _ = writeln!(
                s,
                "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{c}\" \
                 stroke-width=\"2\"{}/><text x=\"{}\" y=\"{}\">{}</text>",
                w - mr + 10.0,
                w - mr + 35.0,
                st.dash(),
                w - mr + 40.0,
                ly + 4.0,
                xml(name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_data() {
        assert_eq!(nice_ticks(1034.0, 5), (200.0, 1200.0));
        assert_eq!(nice_ticks(940.0, 5), (200.0, 1000.0));
        assert_eq!(nice_ticks(7.0, 5), (2.0, 8.0));
        assert_eq!(nice_ticks(100.0, 5), (20.0, 100.0));
        let (step, end) = nice_ticks(0.37, 5);
        assert!((step - 0.1).abs() < 1e-12 && (end - 0.4).abs() < 1e-12);
        assert_eq!(nice_ticks(0.0, 5), (1.0, 1.0));
        assert_eq!(nice_ticks(f64::NAN, 5), (1.0, 1.0));
        assert_eq!(label(0.30000000000000004, 0.1), "0.3");
        assert_eq!(label(1200.0, 200.0), "1200");
    }

    fn plot() -> Plot {
        Plot {
            title: "t<1>".into(),
            xlabel: "time (s)".into(),
            ylabel: "Mbit/s".into(),
            series: vec!["vm1".into(), "vm2".into()],
            lines: vec![
                Line {
                    series: 0,
                    style: Style::Solid,
                    points: vec![(0.0, 90.0), (10.0, 310.0)],
                    markers: false,
                },
                Line {
                    series: 1,
                    style: Style::Dotted,
                    points: vec![(0.0, 100.0), (10.0, 300.0)],
                    markers: true,
                },
            ],
            phases: vec![(0.0, "phase 1".into()), (5.0, "phase 2".into())],
            styles: vec![
                (Style::Solid, "measured".into()),
                (Style::Dotted, "simulated".into()),
            ],
            x_max: Some(10.0),
        }
    }

    #[test]
    fn svg_marks_phases_explains_styles_and_labels_round_ticks() {
        let svg = plot().svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t&lt;1&gt;"), "title escaped");
        assert_eq!(svg.matches("class=\"phase\"").count(), 1, "phase 2 only");
        assert!(svg.contains(">phase 2<") && !svg.contains(">phase 1<"));
        assert!(svg.contains(">measured<") && svg.contains(">simulated<"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(
            svg.matches("<circle").count(),
            2,
            "markers on the dotted line"
        );
        // y axis: 0..=400 in steps of 100 (max 310 × 1.05).
        for v in ["0", "100", "200", "300", "400"] {
            assert!(
                svg.contains(&format!("text-anchor=\"end\">{v}</text>")),
                "{v}"
            );
        }
        assert!(!svg.contains("text-anchor=\"end\">500</text>"));
    }
}
