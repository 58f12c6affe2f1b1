//! Results: one JSON object per scenario (`--json`, one per line), a table on
//! the terminal, and a latency-distribution SVG (`--svg`).

use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::stats::{Integrity, Summary};

/// A target from the issue, checked against a measurement.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    /// What is checked.
    pub name: String,
    /// The bound, as text.
    pub target: String,
    /// What was measured, as text.
    pub measured: String,
    /// Whether the measurement meets the bound.
    pub met: bool,
}

/// A latency distribution to draw.
#[derive(Clone)]
pub struct Curve {
    /// Legend text.
    pub label: String,
    /// Samples in microseconds.
    pub hist: Histogram<u64>,
}

/// What one scenario measured. The named fields are always present in the
/// JSON (null when a scenario does not measure them); `extra` holds the
/// scenario's other figures.
#[derive(Clone, Serialize, Default)]
pub struct ScenarioResult {
    pub scenario: String,
    /// What was tested.
    pub server: String,
    /// The sizes and flags of the run.
    pub params: Value,
    pub deliveries_per_sec: Option<f64>,
    pub baseline_deliveries_per_sec: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub lost: Option<u64>,
    pub duplicated: Option<u64>,
    pub reordered: Option<u64>,
    pub converged: Option<bool>,
    pub actions_per_sec: Option<f64>,
    pub rss_bytes_per_connection: Option<f64>,
    pub seconds: Option<f64>,
    /// Scenario-specific figures.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    /// The issue's targets, checked.
    pub targets: Vec<TargetCheck>,
    /// Anything the reader must know to interpret the numbers.
    pub notes: Vec<String>,
    /// Distributions for the SVG.
    #[serde(skip)]
    pub curves: Vec<Curve>,
    /// A correctness check failed (loss, duplicates, order, convergence).
    #[serde(skip)]
    pub failed: bool,
}

fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

impl ScenarioResult {
    /// A result for `scenario` against `server`.
    pub fn new(scenario: &str, server: &str, params: Value) -> Self {
        Self {
            scenario: scenario.into(),
            server: server.into(),
            params,
            ..Self::default()
        }
    }

    /// Set the four latency fields from a summary.
    pub fn set_latency(&mut self, s: &Summary) {
        if s.count == 0 {
            return;
        }
        self.p50_ms = Some(round(s.p50_ms, 3));
        self.p99_ms = Some(round(s.p99_ms, 3));
        self.p999_ms = Some(round(s.p999_ms, 3));
        self.max_ms = Some(round(s.max_ms, 3));
    }

    /// Set loss / duplicates / reordering; marks the result failed unless clean.
    pub fn set_integrity(&mut self, i: &Integrity) {
        self.lost = Some(i.lost);
        self.duplicated = Some(i.duplicated);
        self.reordered = Some(i.reordered);
        if !i.clean() {
            self.failed = true;
        }
    }

    /// Add `prefix_p50_ms` … `prefix_max_ms` and `prefix_samples` extras.
    pub fn put_latency(&mut self, prefix: &str, s: &Summary) {
        if s.count == 0 {
            return;
        }
        self.put(&format!("{prefix}_p50_ms"), round(s.p50_ms, 3));
        self.put(&format!("{prefix}_p99_ms"), round(s.p99_ms, 3));
        self.put(&format!("{prefix}_p999_ms"), round(s.p999_ms, 3));
        self.put(&format!("{prefix}_max_ms"), round(s.max_ms, 3));
        self.put(&format!("{prefix}_samples"), s.count);
    }

    /// Add an extra figure (floats are rounded to 3 decimals).
    pub fn put(&mut self, key: &str, v: impl Into<Value>) {
        let v = match v.into() {
            Value::Number(n) if n.is_f64() => {
                serde_json::json!(round(n.as_f64().unwrap_or(0.0), 3))
            }
            v => v,
        };
        self.extra.insert(key.to_owned(), v);
    }

    /// Check a target.
    pub fn target(&mut self, name: &str, target: &str, measured: String, met: bool) {
        self.targets.push(TargetCheck {
            name: name.into(),
            target: target.into(),
            measured,
            met,
        });
    }

    /// Add a note.
    pub fn note(&mut self, n: impl Into<String>) {
        self.notes.push(n.into());
    }

    /// Add a curve for the SVG.
    pub fn curve(&mut self, label: &str, hist: &Histogram<u64>) {
        if !hist.is_empty() {
            self.curves.push(Curve {
                label: label.into(),
                hist: hist.clone(),
            });
        }
    }
}

fn fmt_value(v: &Value) -> String {
    match v {
        Value::Number(n) => {
            if let Some(i) = n.as_u64() {
                group(i)
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                if f.abs() >= 1000.0 {
                    group(f.round() as u64)
                } else {
                    format!("{}", round(f, 3))
                }
            }
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// 1234567 → "1,234,567".
pub fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The table printed at the end of a scenario.
pub fn table(r: &ScenarioResult) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n== {} — {} ==", r.scenario, r.server);
    let _ = writeln!(out, "  params: {}", r.params);
    let json = serde_json::to_value(r).unwrap_or(Value::Null);
    let skip = ["scenario", "server", "params", "targets", "notes"];
    if let Value::Object(map) = json {
        let width = map.keys().map(String::len).max().unwrap_or(10);
        for (k, v) in &map {
            if skip.contains(&k.as_str()) || v.is_null() {
                continue;
            }
            let _ = writeln!(out, "  {k:<width$}  {}", fmt_value(v));
        }
    }
    if !r.targets.is_empty() {
        let _ = writeln!(out, "  targets:");
        for t in &r.targets {
            let _ = writeln!(
                out,
                "    [{}] {}: {} (measured {})",
                if t.met { " met  " } else { "MISSED" },
                t.name,
                t.target,
                t.measured
            );
        }
    }
    for n in &r.notes {
        let _ = writeln!(out, "  note: {n}");
    }
    out
}

/// Write results, one JSON object per line.
pub fn write_json(path: &Path, results: &[ScenarioResult]) -> anyhow::Result<()> {
    let mut text = String::new();
    for r in results {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    std::fs::write(path, text)?;
    Ok(())
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// x position of a quantile on the "nines" axis: log10(1 / (1 - q)),
/// capped at 6 (99.9999%).
fn nines(q: f64) -> f64 {
    if q >= 1.0 {
        6.0
    } else {
        (1.0 / (1.0 - q)).log10().min(6.0)
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" axis maximum ≥ v.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

/// The latency distribution of every curve in `results`: latency (ms,
/// linear) against percentile (0 … 99.9999 %, log "nines" axis), the usual
/// HdrHistogram percentile plot.
pub fn svg(results: &[ScenarioResult]) -> String {
    let curves: Vec<(String, &Curve)> = results
        .iter()
        .flat_map(|r| {
            r.curves
                .iter()
                .map(move |c| (format!("{}: {}", r.scenario, c.label), c))
        })
        .collect();
    let (w, h) = (960.0, 560.0);
    let (l, r, t, b) = (80.0, 30.0, 50.0, 60.0);
    let pw = w - l - r;
    let ph = h - t - b;
    let max_q = curves
        .iter()
        .map(|(_, c)| nines(1.0 - 1.0 / c.hist.len().max(1) as f64))
        .fold(2.0, f64::max)
        .ceil()
        .min(6.0);
    let max_ms = nice_max(
        curves
            .iter()
            .map(|(_, c)| c.hist.max() as f64 / 1000.0)
            .fold(0.0, f64::max),
    );
    let x = |q: f64| l + pw * (nines(q) / max_q).min(1.0);
    let y = |ms: f64| t + ph * (1.0 - (ms / max_ms).min(1.0));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let mut title = results
        .iter()
        .map(|r| format!("{} {}", r.scenario, r.params))
        .collect::<Vec<_>>()
        .join("; ");
    if title.chars().count() > 100 {
        title = title.chars().take(99).collect::<String>() + "…";
    }
    let _ = writeln!(
        s,
        r#"<text x="{l}" y="22" font-size="14" font-weight="bold">Latency by percentile — {}</text>"#,
        esc(&title)
    );
    // Grid and axes.
    for i in 0..=5 {
        let ms = max_ms * i as f64 / 5.0;
        let yy = y(ms);
        let _ = writeln!(
            s,
            r##"<line x1="{l}" y1="{yy}" x2="{}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            l + pw,
            l - 6.0,
            yy + 4.0,
            round(ms, 3)
        );
    }
    for k in 0..=(max_q as i32) {
        let q = 1.0 - 10f64.powi(-k);
        let xx = x(q);
        let label = match k {
            0 => "0%".to_owned(),
            1 => "90%".to_owned(),
            k => format!("99.{}%", "9".repeat(k as usize - 2)).replace("99.%", "99%"),
        };
        let _ = writeln!(
            s,
            r##"<line x1="{xx}" y1="{t}" x2="{xx}" y2="{}" stroke="#ddd"/><text x="{xx}" y="{}" text-anchor="middle">{label}</text>"##,
            t + ph,
            t + ph + 18.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">percentile</text>"#,
        l + pw / 2.0,
        h - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">latency (ms)</text>"#,
        t + ph / 2.0,
        t + ph / 2.0
    );
    let _ = writeln!(
        s,
        r#"<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    // Curves.
    for (i, (label, c)) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut pts = Vec::new();
        for v in c.hist.iter_quantiles(5) {
            let q = v.quantile_iterated_to();
            let ms = v.value_iterated_to() as f64 / 1000.0;
            pts.push(format!("{:.1},{:.1}", x(q), y(ms)));
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = t + 16.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            l + 12.0,
            l + 36.0,
            l + 42.0,
            ly + 4.0,
            esc(&format!(
                "{label} (p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, n={})",
                c.hist.value_at_quantile(0.5) as f64 / 1000.0,
                c.hist.value_at_quantile(0.99) as f64 / 1000.0,
                c.hist.max() as f64 / 1000.0,
                c.hist.len()
            ))
        );
    }
    if curves.is_empty() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">no latency samples</text>"#,
            l + pw / 2.0,
            t + ph / 2.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{new_hist, record_ns};

    fn sample() -> ScenarioResult {
        let mut h = new_hist();
        for i in 1..=10_000u64 {
            record_ns(&mut h, i * 1_000);
        }
        let mut r = ScenarioResult::new("fanout", "tandem", serde_json::json!({"chats": 1}));
        r.set_latency(&Summary::of(&h));
        r.set_integrity(&Integrity::default());
        r.deliveries_per_sec = Some(12345.678);
        r.put("last_p99_ms", 4.56789);
        r.target("ratio", "≥ 70%", "82%".into(), true);
        r.curve("every receiver", &h);
        r
    }

    #[test]
    fn json_has_the_issue_fields_even_when_null() {
        let v = serde_json::to_value(sample()).unwrap();
        for k in [
            "scenario",
            "deliveries_per_sec",
            "baseline_deliveries_per_sec",
            "p50_ms",
            "p99_ms",
            "p999_ms",
            "max_ms",
            "lost",
            "duplicated",
            "reordered",
            "converged",
            "actions_per_sec",
            "rss_bytes_per_connection",
            "seconds",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["last_p99_ms"], 4.568);
        assert_eq!(v["lost"], 0);
        assert!(v["converged"].is_null());
        let dir = std::env::temp_dir().join(format!("lt-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("r.json");
        write_json(&f, &[sample(), sample()]).unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        assert_eq!(text.lines().count(), 2);
        for line in text.lines() {
            let _: Value = serde_json::from_str(line).unwrap();
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn table_and_svg_render() {
        let r = sample();
        let t = table(&r);
        assert!(t.contains("12,346"), "{t}");
        assert!(t.contains("[ met  ] ratio"), "{t}");
        let s = svg(&[r]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("<polyline"));
        assert!(s.contains("99.9%"));
        assert!(svg(&[]).contains("no latency samples"));
        assert_eq!(group(1234567), "1,234,567");
        assert_eq!(nice_max(7.3), 10.0);
        assert_eq!(nice_max(0.23), 0.25);
    }
}
