//! ARCHITECTURE.md's code map names only what exists: every path in it is a
//! file or directory of the repository, and every name (a module, type,
//! function, constant, variable or Redis command) is spelled somewhere in the
//! code. A renamed or removed item then fails here, not in a newcomer's search.
//!
//! What counts, per inline code span of the "Code map" section:
//! - a path (`worker/src/cache.rs`, `tools/`, `lib.rs`, `finish.lua`): it
//!   exists under the repository, under the crate whose `###` heading it
//!   stands under, or (a bare file name) somewhere in that crate;
//! - a name or a path of names (`TaskRecord::from_fields`, `Keys::task`,
//!   `REDIS_SENTINELS`, `shared::view`): each segment is a word of the code
//!   (Rust, Lua, shell and Python sources; not the docs, which would make the
//!   check pass on itself);
//! - anything else (text with spaces, `sr-<task_id>`, `0700`, `/workspace`)
//!   is prose, and is not checked.
//!
//! Self-contained: it reads files only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, HeadingLevel, Parser, Tag, TagEnd};

const DOC: &str = "ARCHITECTURE.md";
const SECTION: &str = "Code map";

/// Where the sources whose words count live, and what they end in.
const SOURCE_DIRS: &[&str] = &[
    "api", "worker", "shared", "store", "blobs", "ctl", "testkit", "e2e", "scripts", "deploy",
    "tests",
];
const SOURCE_EXTENSIONS: &[&str] = &["rs", "lua", "sh", "py", "toml", "yml"];

/// What a path in the map may end in, besides `/`.
const PATH_EXTENSIONS: &[&str] = &[
    ".rs", ".lua", ".md", ".sh", ".py", ".toml", ".yml", ".json", ".txt", ".html",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every file and directory under `dir`, skipping build output and virtual
/// environments.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !["target", ".venv", ".git", "node_modules", "__pycache__"].contains(&&*name) {
                files_under(&path, out);
                out.push(path);
            }
        } else {
            out.push(path);
        }
    }
}

/// The words of the code: identifiers, and the words inside its strings.
fn code_words() -> BTreeSet<String> {
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        files_under(&repo_root().join(dir), &mut files);
    }
    files.push(repo_root().join("Dockerfile"));
    let mut words = BTreeSet::new();
    for f in files {
        let counts = f.is_file()
            && f.extension()
                .is_some_and(|e| SOURCE_EXTENSIONS.contains(&&*e.to_string_lossy()))
            || f.file_name().is_some_and(|n| n == "Dockerfile");
        if !counts {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for w in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !w.is_empty() {
                words.insert(w.to_owned());
            }
        }
    }
    words
}

/// The inline code spans of the map's section, each with the crate directory
/// of the `###` heading it stands under (`None` above the first).
fn map_spans(markdown: &str) -> Vec<(Option<String>, String)> {
    let mut spans = Vec::new();
    let mut in_section = false;
    let mut heading: Option<(HeadingLevel, String)> = None;
    let mut krate: Option<String> = None;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::Heading { level, .. }) => heading = Some((level, String::new())),
            Event::End(TagEnd::Heading(_)) => {
                let Some((level, text)) = heading.take() else {
                    continue;
                };
                match level {
                    HeadingLevel::H2 => {
                        in_section = text == SECTION;
                        krate = None;
                    }
                    // A crate's heading is its directory (`api/`); others
                    // ("Tests and scripts") span the repository.
                    HeadingLevel::H3 if in_section => {
                        krate = text
                            .strip_suffix('/')
                            .filter(|d| is_identifier(d))
                            .map(str::to_owned)
                    }
                    _ => {}
                }
            }
            Event::Text(t) | Event::Code(t) if heading.is_some() => {
                if let Some((_, text)) = heading.as_mut() {
                    text.push_str(&t);
                }
            }
            Event::Code(code) if in_section => spans.push((krate.clone(), code.to_string())),
            _ => {}
        }
    }
    spans
}

fn is_identifier(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What a span is, for the check.
#[derive(Debug, PartialEq)]
enum Span<'a> {
    Path(&'a str),
    Names(Vec<&'a str>),
    Prose,
}

fn classify(span: &str) -> Span<'_> {
    // An extension alone (`.lua`) names a kind of file, not one.
    if span.starts_with('.') && !span[1..].contains(['.', '/']) {
        return Span::Prose;
    }
    let top_dir = SOURCE_DIRS
        .iter()
        .chain(&["docs", ".ci"])
        .any(|d| span.starts_with(&format!("{d}/")));
    let path_like = !span.contains(char::is_whitespace)
        && !span.starts_with('/')
        && !span.contains(['<', '>', '*', '='])
        && (top_dir
            || span.ends_with('/') && is_identifier(span.trim_end_matches('/'))
            || PATH_EXTENSIONS.iter().any(|e| span.ends_with(e)));
    if path_like {
        return Span::Path(span);
    }
    // `Type::method`, `module.item`, `f()`; the call's parentheses dropped.
    let names: Vec<&str> = span
        .trim_end_matches("()")
        .split("::")
        .flat_map(|s| s.split('.'))
        .collect();
    if names.iter().all(|n| is_identifier(n)) {
        Span::Names(names)
    } else {
        Span::Prose
    }
}

/// Whether `path`, as the map writes it under crate `krate`, exists.
fn path_exists(krate: Option<&str>, path: &str) -> bool {
    let root = repo_root();
    let rel = path.trim_end_matches('/');
    let mut candidates = vec![root.join(rel)];
    if let Some(k) = krate {
        candidates.push(root.join(k).join(rel));
        candidates.push(root.join(k).join("src").join(rel));
    }
    if candidates.iter().any(|c| c.exists()) {
        return true;
    }
    // A bare file or directory name (`mod.rs` under `runner/`, `finish.lua`,
    // `harness/`): somewhere in its crate, or in the repository's sources.
    if !rel.contains('/') {
        let mut files = Vec::new();
        let dirs: Vec<PathBuf> = match krate {
            Some(k) => vec![root.join(k)],
            None => SOURCE_DIRS.iter().map(|d| root.join(d)).collect(),
        };
        for d in dirs {
            files_under(&d, &mut files);
        }
        return files
            .iter()
            .any(|f| f.file_name().is_some_and(|n| n.to_string_lossy() == rel));
    }
    false
}

/// Every path and name the map mentions that the repository lacks.
fn broken(markdown: &str, words: &BTreeSet<String>) -> Vec<String> {
    let mut broken = Vec::new();
    for (krate, span) in map_spans(markdown) {
        match classify(&span) {
            Span::Path(p) if !path_exists(krate.as_deref(), p) => {
                broken.push(format!("path `{p}` (under {krate:?})"))
            }
            Span::Names(names) => {
                for n in names.iter().filter(|n| !words.contains(**n)) {
                    broken.push(format!("name `{n}` in `{span}` (under {krate:?})"));
                }
            }
            _ => {}
        }
    }
    broken
}

#[test]
fn every_path_and_name_in_the_code_map_exists() {
    let path = repo_root().join(DOC);
    let doc = std::fs::read_to_string(&path).expect("ARCHITECTURE.md");
    let spans = map_spans(&doc);
    assert!(
        spans.len() > 200,
        "the code map section was not found, or lost its names: {} spans",
        spans.len()
    );
    let broken = broken(&doc, &code_words());
    assert!(
        broken.is_empty(),
        "ARCHITECTURE.md's code map names what the code lacks:\n  {}",
        broken.join("\n  ")
    );
}

/// The check itself: a name or path broken by hand is caught, prose is not
/// taken for either.
#[test]
fn a_broken_name_or_path_in_the_map_is_caught() {
    let words: BTreeSet<String> = ["Keys", "task", "run"].map(str::to_owned).into();
    let doc = "## Code map\n\n### `shared/`\n\n\
               - `keys`: `Keys::task`, `Keys::tasc`, `run()`, `src/lib.rs`, `nowhere.rs`, \
               `sr-<task_id>`, `maxmemory-policy noeviction`, `/workspace`.\n\n\
               ## Invariants\n\n- `Unchecked`\n";
    assert_eq!(
        broken(doc, &words),
        [
            "name `keys` in `keys` (under Some(\"shared\"))",
            "name `tasc` in `Keys::tasc` (under Some(\"shared\"))",
            "path `nowhere.rs` (under Some(\"shared\"))",
        ]
    );
    assert_eq!(classify("tools/"), Span::Path("tools/"));
    assert_eq!(classify("XREAD BLOCK"), Span::Prose);
}
