//! Reads a Prometheus text exposition back into its metric families, so each
//! binary's tests can pin what its `/metrics` serves: the Grafana dashboard and
//! any alert query these names, types and labels, and a rename must fail a test
//! rather than empty a panel.

use std::collections::{BTreeMap, BTreeSet};

/// A metric family as a scraper sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// `counter`, `gauge`, `histogram`, ...; `undeclared` for samples no
    /// `# TYPE` line names.
    pub kind: String,
    /// The label names its samples carry (a histogram bucket's `le` left out).
    pub labels: BTreeSet<String>,
}

/// Every family in `text`, by name (as `# TYPE` names it).
pub fn families(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let (name, kind) = decl.split_once(' ').unwrap_or((decl, ""));
            out.insert(
                name.to_owned(),
                Family {
                    kind: kind.to_owned(),
                    labels: BTreeSet::new(),
                },
            );
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let sample = &line[..name_end];
        let family = [sample]
            .into_iter()
            .chain(
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .filter_map(|s| sample.strip_suffix(s)),
            )
            .find(|f| out.contains_key(*f))
            .unwrap_or(sample)
            .to_owned();
        let entry = out.entry(family).or_insert_with(|| Family {
            kind: "undeclared".to_owned(),
            labels: BTreeSet::new(),
        });
        entry.labels.extend(
            label_names(&line[name_end..])
                .into_iter()
                .filter(|l| !(l == "le" && sample.ends_with("_bucket"))),
        );
    }
    out
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

/// The label names in `{a="x",b="y"} 1`, reading values with their escapes.
fn label_names(rest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let Some(mut rest) = rest.strip_prefix('{') else {
        return names;
    };
    while let Some((name, value)) = rest.split_once("=\"") {
        names.push(name.trim_start_matches(',').trim().to_owned());
        let mut chars = value.char_indices();
        let mut end = value.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &value[end..];
        if rest.starts_with('}') {
            break;
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_carry_their_type_and_label_names() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\n\
                    a_total{x=\"q\\\"u,o=te\",y=\"\"} 1\n\
                    # TYPE h histogram\nh_bucket{r=\"p\",le=\"1\"} 0\nh_bucket{r=\"p\",le=\"+Inf\"} 0\n\
                    h_sum{r=\"p\"} 0\nh_count{r=\"p\"} 0\n# TYPE g gauge\nstray 3\n";
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
        assert_eq!(f.len(), 4);
    }
}
