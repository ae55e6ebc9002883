//! Reads a Prometheus text exposition (format 0.0.4, what prometheus-client's
//! `prometheus_text` encoder writes) back into its families and samples, so
//! every test reads `/metrics` the way a scraper does instead of matching
//! substrings: the Grafana dashboard and any alert query these names, types
//! and labels, and a rename must fail a test rather than empty a panel.
//!
//! It is strict where a scraper is: a line it cannot read, a family typed
//! twice or a series served twice is an error, so a broken exposition fails
//! the test that reads it instead of reading as "that sample is missing".
//! The one reader for every crate's tests (the api's and the worker's unit
//! tests, and e2e). Not a crate: prometheus-parse misreads label values that
//! hold `,`, `=` or an escape, and openmetrics-parser is LGPL-3.0.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A metric family as a scraper sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// `counter`, `gauge`, `histogram`, ...; `undeclared` for samples no
    /// `# TYPE` line names.
    pub kind: String,
    /// The label names its samples carry (a histogram bucket's `le` and a
    /// summary's `quantile` left out: they are the family's shape, not its
    /// labels).
    pub labels: BTreeSet<String>,
}

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's own name (a histogram's `x_bucket`, `x_sum`, `x_count`).
    pub name: String,
    /// Label values unescaped.
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A line the reader refused, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based.
    pub line: usize,
    pub text: String,
    pub why: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}: {:?}", self.line, self.why, self.text)
    }
}

impl std::error::Error for ParseError {}

/// A whole exposition: what `# TYPE` declared, and every sample in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exposition {
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

/// The types the 0.0.4 text format knows; anything else is a typo.
const KINDS: [&str; 5] = ["counter", "gauge", "histogram", "summary", "untyped"];

impl Exposition {
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let mut out = Exposition::default();
        let mut series = BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            let err = |why: &str| ParseError {
                line: i + 1,
                text: line.to_owned(),
                why: why.to_owned(),
            };
            if let Some(decl) = line.strip_prefix("# TYPE ") {
                let (name, kind) = decl
                    .split_once(' ')
                    .ok_or_else(|| err("TYPE without a type"))?;
                if !is_metric_name(name) || !KINDS.contains(&kind) {
                    return Err(err("not `# TYPE <name> <type>`"));
                }
                if out.types.insert(name.to_owned(), kind.to_owned()).is_some() {
                    return Err(err("a second TYPE for the family"));
                }
                continue;
            }
            // HELP and any other comment: nothing a test pins is in them.
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let sample = parse_sample(line).map_err(err)?;
            if !series.insert((sample.name.clone(), sample.labels.clone())) {
                return Err(err("the same series twice"));
            }
            out.samples.push(sample);
        }
        Ok(out)
    }

    /// Every family, by name (as `# TYPE` names it): declared ones even with no
    /// sample, and samples no `# TYPE` covers as `undeclared` families of their
    /// own.
    pub fn families(&self) -> BTreeMap<String, Family> {
        let mut out: BTreeMap<String, Family> = self
            .types
            .iter()
            .map(|(name, kind)| {
                let family = Family {
                    kind: kind.clone(),
                    labels: BTreeSet::new(),
                };
                (name.clone(), family)
            })
            .collect();
        for s in &self.samples {
            let (family, shape) = self.family_of(&s.name);
            let entry = out.entry(family.to_owned()).or_insert_with(|| Family {
                kind: "undeclared".to_owned(),
                labels: BTreeSet::new(),
            });
            entry.labels.extend(
                s.labels
                    .keys()
                    .filter(|l| Some(l.as_str()) != shape)
                    .cloned(),
            );
        }
        out
    }

    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The sample names served (`x_bucket`, not `x`, for a histogram): what a
    /// PromQL query names.
    pub fn sample_names(&self) -> BTreeSet<String> {
        self.samples.iter().map(|s| s.name.clone()).collect()
    }

    /// The value of the series `name` with exactly the labels `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// [`Self::value`] of a count (a counter, a histogram's `_count`, a gauge
    /// of things); panics if the value is not a whole number, which no count
    /// can be, rather than truncating it.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        let v = self.value(name, labels)?;
        assert!(
            v >= 0.0 && v.fract() == 0.0 && v <= u64::MAX as f64,
            "{name}{labels:?} is {v}, not a count"
        );
        Some(v as u64)
    }

    /// The family a sample belongs to, and the label that is its shape there
    /// (`le`, `quantile`) rather than one of its labels.
    fn family_of<'a>(&self, sample: &'a str) -> (&'a str, Option<&'static str>) {
        let kind = |f: &str| self.types.get(f).map(String::as_str);
        match kind(sample) {
            Some("summary") => return (sample, Some("quantile")),
            Some(_) => return (sample, None),
            None => {}
        }
        let suffixed = [
            ("_bucket", &["histogram"][..], Some("le")),
            ("_sum", &["histogram", "summary"][..], None),
            ("_count", &["histogram", "summary"][..], None),
        ];
        for (suffix, kinds, shape) in suffixed {
            if let Some(base) = sample.strip_suffix(suffix)
                && kind(base).is_some_and(|k| kinds.contains(&k))
            {
                return (base, shape);
            }
        }
        (sample, None)
    }
}

/// [`Exposition::parse`] for a test: panics, with the line and the whole text,
/// on an exposition a scraper would refuse.
pub fn read(text: &str) -> Exposition {
    Exposition::parse(text).unwrap_or_else(|e| panic!("unreadable exposition, {e}, in:\n{text}"))
}

/// Every family in `text`, by name; see [`Exposition::families`].
pub fn families(text: &str) -> BTreeMap<String, Family> {
    read(text).families()
}

/// Families written as `(name, type, label names)`, to compare with [`families`].
pub fn listed(list: &[(&str, &str, &[&str])]) -> BTreeMap<String, Family> {
    list.iter()
        .map(|(name, kind, labels)| {
            let family = Family {
                kind: (*kind).to_owned(),
                labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            };
            ((*name).to_owned(), family)
        })
        .collect()
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `name{a="x",b="y"} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line.find(['{', ' ']).ok_or("a sample without a value")?;
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err("not a metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = parse_labels(inner, &mut labels)?;
    }
    let mut fields = rest
        .strip_prefix(' ')
        .ok_or("no space before the value")?
        .split(' ');
    let value = fields
        .next()
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or("not a number")?;
    if let Some(ts) = fields.next()
        && ts.parse::<i64>().is_err()
    {
        return Err("not a timestamp");
    }
    if fields.next().is_some() {
        return Err("more after the timestamp");
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Reads `a="x",b="y"}` (after the `{`) into `labels`, unescaping the values;
/// what follows the `}`.
fn parse_labels<'a>(
    mut rest: &'a str,
    labels: &mut BTreeMap<String, String>,
) -> Result<&'a str, &'static str> {
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok(after);
        }
        let (name, after) = rest.split_once("=\"").ok_or("not `name=\"value\"`")?;
        if !is_label_name(name) {
            return Err("not a label name");
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().ok_or("an unterminated label value")? {
                (_, '\\') => match chars.next().ok_or("an unterminated label value")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    _ => return Err("an unknown escape in a label value"),
                },
                (i, '"') => break i + 1,
                (_, c) => value.push(c),
            }
        };
        if labels.insert(name.to_owned(), value).is_some() {
            return Err("a label twice");
        }
        rest = &after[end..];
        // The format allows a comma before the closing brace.
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err("no comma between labels");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_carry_their_type_and_label_names() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\n\
                    a_total{x=\"q\\\"u,o=te\",y=\"\"} 1\n\
                    # TYPE h histogram\nh_bucket{r=\"p\",le=\"1\"} 0\nh_bucket{r=\"p\",le=\"+Inf\"} 0\n\
                    h_sum{r=\"p\"} 0\nh_count{r=\"p\"} 0\n# TYPE g gauge\nstray 3\n\
                    # TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 1\ns_count 1\n";
        let f = families(text);
        let names = |f: &Family| f.labels.iter().cloned().collect::<Vec<_>>();
        assert_eq!(f["a_total"].kind, "counter");
        assert_eq!(names(&f["a_total"]), ["x", "y"]);
        assert_eq!(
            (f["h"].kind.as_str(), names(&f["h"])),
            ("histogram", vec!["r".to_owned()])
        );
        assert!(f["g"].labels.is_empty());
        assert_eq!(f["stray"].kind, "undeclared");
        assert_eq!((f["s"].kind.as_str(), f["s"].labels.len()), ("summary", 0));
        assert_eq!(f.len(), 5);
    }

    #[test]
    fn samples_are_read_by_name_and_exact_labels_with_values_unescaped() {
        let e = read(
            "# TYPE c_total counter\nc_total{path=\"warm\"} 3\nc_total{path=\"cold\"} 0 1700000000000\n\
             o{owner=\"oauth:a\\\"b,c=}\\\\\\n\",} 2.5\nh_bucket{le=\"+Inf\"} 7\nplain 1\n",
        );
        assert_eq!(e.count("c_total", &[("path", "warm")]), Some(3));
        assert_eq!(e.count("c_total", &[("path", "cold")]), Some(0));
        // Exact labels: a subset names no series.
        assert_eq!(e.value("c_total", &[]), None);
        assert_eq!(e.value("o", &[("owner", "oauth:a\"b,c=}\\\n")]), Some(2.5));
        assert_eq!(e.value("h_bucket", &[("le", "+Inf")]), Some(7.0));
        assert_eq!(e.count("plain", &[]), Some(1));
        assert_eq!(
            e.sample_names().into_iter().collect::<Vec<_>>(),
            ["c_total", "h_bucket", "o", "plain"]
        );
    }

    #[test]
    fn what_a_scraper_would_refuse_is_an_error_naming_the_line() {
        for (text, why) in [
            (
                "# TYPE a counter\n# TYPE a gauge\n",
                "a second TYPE for the family",
            ),
            ("# TYPE a countr\n", "not `# TYPE <name> <type>`"),
            ("a 1\na 2\n", "the same series twice"),
            ("a{x=\"1\",x=\"2\"} 1\n", "a label twice"),
            ("a{x=\"1\" 1\n", "no comma between labels"),
            ("a{x=\"1} 1\n", "an unterminated label value"),
            ("a{x=\"\\t\"} 1\n", "an unknown escape in a label value"),
            ("a{1x=\"1\"} 1\n", "not a label name"),
            ("a one\n", "not a number"),
            ("a 1 now\n", "not a timestamp"),
            ("a\n", "a sample without a value"),
            ("a-b 1\n", "not a metric name"),
        ] {
            let e = Exposition::parse(&format!("ok 1\n{text}")).expect_err(text);
            assert_eq!((e.why.as_str(), e.line > 1), (why, true), "{text:?}");
        }
    }

    #[test]
    #[should_panic(expected = "not a count")]
    fn a_fractional_count_is_refused_not_truncated() {
        read("a 1.5\n").count("a", &[]);
    }
}
