//! The docs say what the code does, and they hang together:
//!
//! - the configuration: every variable either binary reads is in the table of
//!   `docs/configuration.md` and in `.env.example`, and each literal default
//!   declared in code is the default both state;
//! - the Redis key schema: `docs/redis-keys.md` lists exactly the keys `Keys`
//!   builds and the fields `Field` names (and the values they hold that the
//!   code spells: states, reason kinds, stats fields, the heartbeat);
//! - the links: every relative link in every Markdown file of the repository
//!   names a file that exists, and every `#anchor` a heading of its target.
//!
//! Self-contained on purpose (no `mod common`): it reads files and calls pure
//! functions, and needs no Redis or Docker.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use shared::apikey::ApiKeyField;
use shared::envvar::{COMMON_VARS, Var};
use shared::keys::{
    HEARTBEAT_RUNNING, Heartbeat, JOB_TASK_ID, STAT_FINISHED_PREFIX, STAT_SUBMITTED,
    STATS_MINUTE_TTL_SECONDS, WORKER_GROUP,
};
use shared::{Field, Keys, ReasonKind, TaskState};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

const CONFIG_DOC: &str = "docs/configuration.md";
const KEYS_DOC: &str = "docs/redis-keys.md";
const KEYS_SOURCE: &str = "shared/src/keys.rs";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn repo_file(name: &str) -> String {
    let path = repo_root().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------
// Markdown, read with a CommonMark parser (GitHub's tables on) rather than by
// splitting lines, so code blocks, escaped pipes and inline code are what
// GitHub shows.

/// One table cell: its text as written (inline code keeps its backticks, so a
/// default reads "`300`") and the inline code spans in it.
#[derive(Debug, Default, Clone)]
struct Cell {
    text: String,
    code: Vec<String>,
}

/// The tables of a Markdown text, each a list of rows (the header first).
fn tables(markdown: &str) -> Vec<Vec<Vec<Cell>>> {
    let mut tables = Vec::new();
    let mut rows: Vec<Vec<Cell>> = Vec::new();
    let mut row: Vec<Cell> = Vec::new();
    let mut cell: Option<Cell> = None;
    for event in Parser::new_ext(markdown, Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::TableCell) => cell = Some(Cell::default()),
            Event::End(TagEnd::TableCell) => row.extend(cell.take()),
            Event::End(TagEnd::TableHead | TagEnd::TableRow) => rows.push(std::mem::take(&mut row)),
            Event::End(TagEnd::Table) => tables.push(std::mem::take(&mut rows)),
            Event::Text(t) => {
                if let Some(c) = cell.as_mut() {
                    c.text.push_str(&t)
                }
            }
            Event::Code(t) => {
                if let Some(c) = cell.as_mut() {
                    c.text.push_str(&format!("`{t}`"));
                    c.code.push(t.to_string());
                }
            }
            _ => {}
        }
    }
    tables
}

/// The body rows of the table whose header starts with `header`.
fn table(markdown: &str, doc: &str, header: &[&str]) -> Vec<Vec<Cell>> {
    let found: Vec<_> = tables(markdown)
        .into_iter()
        .filter(|t| {
            t.first()
                .is_some_and(|h| header.iter().zip(h).all(|(want, c)| c.text.trim() == *want))
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{doc} should have one table headed {header:?}"
    );
    found.into_iter().flatten().skip(1).collect()
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_`
/// kept, each space a `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// What a Markdown file offers and asks for: its headings' anchors (a repeated
/// heading gets `-1`, `-2`, ... as on GitHub) and its link targets, with lines.
struct Page {
    anchors: BTreeSet<String>,
    links: Vec<(usize, String)>,
}

fn page(markdown: &str) -> Page {
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut links = Vec::new();
    let mut heading: Option<String> = None;
    let line_of = |offset: usize| markdown[..offset].matches('\n').count() + 1;
    for (event, range) in Parser::new_ext(markdown, Options::ENABLE_TABLES).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t)
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let n = seen.entry(base.clone()).or_insert(0);
                anchors.insert(if *n == 0 { base } else { format!("{base}-{n}") });
                *n += 1;
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                links.push((line_of(range.start), dest_url.to_string()))
            }
            _ => {}
        }
    }
    Page { anchors, links }
}

/// Every Markdown file of the repository, but for build output, virtualenvs and
/// tools' hidden directories (`.git`, `.venv`, `.pytest_cache`, ...).
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            let skipped = matches!(name, "target" | "node_modules")
                || (name.starts_with('.') && !matches!(name, ".github" | ".ci"));
            if !skipped {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// A link that leaves the repository: a URL with a scheme (`https:`,
/// `mailto:`) or a protocol-relative one.
fn is_external(target: &str) -> bool {
    target.starts_with("//")
        || target
            .split_once(':')
            .is_some_and(|(scheme, _)| !scheme.is_empty() && !scheme.contains('/'))
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = repo_root()
        .canonicalize()
        .expect("the repository root exists");
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    files.sort();
    assert!(
        files.iter().any(|f| f.ends_with("README.md"))
            && files.iter().any(|f| f.ends_with(KEYS_DOC)),
        "the walk missed the docs: {files:?}"
    );
    let pages: BTreeMap<PathBuf, Page> = files
        .iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (f.clone(), page(&text))
        })
        .collect();
    let mut broken = Vec::new();
    let mut checked = 0;
    for (file, p) in &pages {
        let shown = file.strip_prefix(&root).unwrap_or(file).display();
        for (line, target) in &p.links {
            if is_external(target) {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let resolved = if path.is_empty() {
                file.clone()
            } else if let Some(from_root) = path.strip_prefix('/') {
                root.join(from_root)
            } else {
                file.parent().expect("a file has a directory").join(path)
            };
            let Ok(resolved) = resolved.canonicalize() else {
                broken.push(format!("{shown}:{line}: {target}: no such file"));
                continue;
            };
            if anchor.is_empty() {
                continue;
            }
            match pages.get(&resolved) {
                Some(t) if t.anchors.contains(anchor) => {}
                Some(_) => broken.push(format!("{shown}:{line}: {target}: no such heading")),
                None => broken.push(format!(
                    "{shown}:{line}: {target}: an anchor into a file that is not Markdown"
                )),
            }
        }
    }
    assert!(checked > 100, "too few links checked ({checked})");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn headings_get_github_s_anchors() {
    assert_eq!(slug("Watching it live (ops)"), "watching-it-live-ops");
    assert_eq!(slug("`run_script`"), "run_script");
    assert_eq!(
        slug("Deployment settings (`.env`)"),
        "deployment-settings-env"
    );
    assert_eq!(slug("1. DNS and the host"), "1-dns-and-the-host");
    let p = page("# A\n## A\n```\n# not a heading [x](nowhere.md)\n```\n[y](b.md#c)\n");
    assert_eq!(
        p.anchors,
        BTreeSet::from(["a".to_owned(), "a-1".to_owned()])
    );
    assert_eq!(p.links, vec![(6, "b.md#c".to_owned())]);
    assert!(is_external("https://example.com/x.md") && is_external("mailto:a@b"));
    assert!(!is_external("docs/tools.md#errors") && !is_external("#x"));
}

// ---------------------------------------------------------------------------
// The Redis key schema.

/// Where a key's variable parts are in the doc.
const ID: &str = "<id>";
const NAME: &str = "<name>";
const MINUTE: &str = "<minute>";
const OWNER: &str = "<owner>";

/// Every key `Keys` builds, by method, with the default prefix the doc shows.
/// A method added to `Keys` must be added here (the next test reads the
/// source to make sure), and then to the doc.
fn keys_in_code() -> Vec<(&'static str, String)> {
    let k = Keys::default();
    let minute: u64 = 29_000_000;
    let ws = shared::workspace::WorkspaceId::from_bytes([0xab; 16]);
    let version: u64 = 29_000_001;
    // A workspace's keys with its id and version number as the doc writes them.
    let placed = |key: String| {
        key.replace(&ws.to_string(), ID)
            .replace(&version.to_string(), "<n>")
    };
    vec![
        ("jobs", k.jobs()),
        ("task", k.task(ID)),
        ("task_zip", k.task_zip(ID)),
        ("task_stdin", k.task_stdin(ID)),
        ("task_files", k.task_files(ID)),
        ("task_events", k.task_events(ID)),
        ("task_index", k.task_index()),
        ("worker", k.worker(NAME)),
        ("workers", k.workers()),
        ("stats", k.stats()),
        ("owner_active", k.owner_active(OWNER)),
        ("owner_cpu", k.owner_cpu(OWNER)),
        ("owner_tasks", k.owner_tasks(OWNER)),
        ("api_key", k.api_key("<sha256>")),
        ("api_key_names", k.api_key_names()),
        ("api_keys_revoked", k.api_keys_revoked()),
        ("owner_usage", k.owner_usage(OWNER)),
        ("usage_owners", k.usage_owners()),
        ("usage_totals", k.usage_totals()),
        ("cache_clears", k.cache_clears()),
        ("workspace", placed(k.workspace(&ws))),
        ("workspace_versions", placed(k.workspace_versions(&ws))),
        (
            "workspace_version",
            placed(k.workspace_version(&ws, version)),
        ),
        ("owner_workspaces", k.owner_workspaces(OWNER)),
        ("workspaces", k.workspaces()),
        ("workspace_bytes", k.workspace_bytes()),
        ("workspace_sweep", k.workspace_sweep()),
        (
            "stats_minute",
            k.stats_minute(minute).replace(&minute.to_string(), MINUTE),
        ),
    ]
}

/// The lines of `shared/src/keys.rs` from `opening` to the `}` that closes it
/// (the first line that is exactly `}`).
fn source_block<'a>(source: &'a str, opening: &str) -> Vec<&'a str> {
    let block: Vec<&str> = source
        .lines()
        .skip_while(|l| l.trim_end() != opening)
        .skip(1)
        .take_while(|l| l.trim_end() != "}")
        .collect();
    assert!(!block.is_empty(), "{KEYS_SOURCE} has no `{opening}`");
    block
}

#[test]
fn keys_in_code_lists_every_key_builder() {
    let source = repo_file(KEYS_SOURCE);
    // `pub fn name(&self, ...) -> String {` in `impl Keys`: the key builders.
    let builders: BTreeSet<&str> = source_block(&source, "impl Keys {")
        .into_iter()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("pub fn ")?;
            let (name, args) = rest.split_once('(')?;
            (args.starts_with("&self") && l.ends_with("-> String {")).then_some(name)
        })
        .collect();
    let listed: BTreeSet<&str> = keys_in_code().into_iter().map(|(m, _)| m).collect();
    assert_eq!(
        builders, listed,
        "keys_in_code() must list every key builder of `Keys` in {KEYS_SOURCE}"
    );
}

#[test]
fn the_key_schema_page_lists_exactly_the_keys_and_fields_of_the_code() {
    let doc = repo_file(KEYS_DOC);
    let key_rows = table(&doc, KEYS_DOC, &["key", "type"]);
    let documented: BTreeSet<String> = key_rows
        .iter()
        .flat_map(|r| r.first().map(|c| c.code.clone()).unwrap_or_default())
        .collect();
    let coded: BTreeSet<String> = keys_in_code().into_iter().map(|(_, k)| k).collect();
    assert_eq!(
        documented, coded,
        "{KEYS_DOC}'s key table and `Keys` disagree (left: the doc, right: the code)"
    );

    let field_rows = table(&doc, KEYS_DOC, &["field", "set by"]);
    let by_field: BTreeMap<String, String> = field_rows
        .iter()
        .flat_map(|r| {
            let rest: String = r.iter().skip(1).map(|c| c.text.as_str()).collect();
            r.first()
                .map(|c| c.code.clone())
                .unwrap_or_default()
                .into_iter()
                .map(move |name| (name, rest.clone()))
        })
        .collect();
    let documented: BTreeSet<&str> = by_field.keys().map(String::as_str).collect();
    let coded: BTreeSet<&str> = Field::ALL.iter().map(|f| f.as_str()).collect();
    assert_eq!(
        documented, coded,
        "{KEYS_DOC}'s field table and `Field` disagree (left: the doc, right: the code)"
    );

    let key_field_rows = table(&doc, KEYS_DOC, &["key field", "value"]);
    let documented: BTreeSet<String> = key_field_rows
        .iter()
        .flat_map(|r| r.first().map(|c| c.code.clone()).unwrap_or_default())
        .collect();
    let coded: BTreeSet<String> = ApiKeyField::ALL
        .iter()
        .map(|f| f.as_str().to_owned())
        .collect();
    assert_eq!(
        documented, coded,
        "{KEYS_DOC}'s API key field table and `ApiKeyField` disagree (left: the doc, right: the code)"
    );

    // The values the code spells, where the doc names them.
    let row = |f: Field| by_field.get(f.as_str()).cloned().unwrap_or_default();
    for s in TaskState::ALL {
        let want = format!("`{}`", s.as_str());
        assert!(
            row(Field::State).contains(&want),
            "{KEYS_DOC}: the state field should list {want}"
        );
    }
    for k in ReasonKind::ALL {
        let want = format!("`{}`", k.as_str());
        assert!(
            row(Field::ReasonKind).contains(&want),
            "{KEYS_DOC}: the reason_kind field should list {want}"
        );
    }
    let heartbeat = Heartbeat {
        running: 7,
        slots: Some(8),
        host: Some("<h>".into()),
        version: Some("<v>".into()),
        ttl_seconds: Some(9),
    }
    .to_value()
    .replace("=7", "=<n>")
    .replace("=8", "=<n>")
    .replace("=9", "=<s>");
    assert!(heartbeat.starts_with(HEARTBEAT_RUNNING));
    let ttl_hours = STATS_MINUTE_TTL_SECONDS / 3600;
    for want in [
        format!("field `{JOB_TASK_ID}`"),
        format!("consumer group `{WORKER_GROUP}`"),
        format!("`{STAT_SUBMITTED}`"),
        format!("`{STAT_FINISHED_PREFIX}<state>:<reason_kind>`"),
        format!("`{heartbeat}`"),
        format!("expires {ttl_hours} h after its last write"),
    ] {
        assert!(doc.contains(&want), "{KEYS_DOC} should say {want}");
    }
}

// ---------------------------------------------------------------------------
// The configuration.

/// The names each binary asks for when it loads its config.
fn names_read() -> BTreeSet<String> {
    let seen = RefCell::new(BTreeSet::new());
    let record = |name: &str| {
        seen.borrow_mut().insert(name.to_owned());
        match name {
            "SCRIPT_RUNNER_TOKEN" => Some(TOKEN.to_owned()),
            "TASK_SIGNING_KEY" => Some(testkit::SIGNING_KEY.to_owned()),
            "TASK_VERIFY_KEYS" => Some(testkit::VERIFY_KEY.to_owned()),
            _ => None,
        }
    };
    script_runner_api::Config::from_lookup(record).expect("api defaults load");
    script_runner_worker::Config::from_lookup(record).expect("worker defaults load");
    seen.into_inner()
}

/// The configuration table: variable name to its default column, for the
/// variables the api or the worker reads.
fn documented_defaults() -> Vec<(String, String)> {
    table(
        &repo_file(CONFIG_DOC),
        CONFIG_DOC,
        &["variable", "used by", "default"],
    )
    .into_iter()
    .filter_map(|row| {
        let name = row.first()?.code.first()?.clone();
        let used_by = &row.get(1)?.text;
        (used_by.contains("api") || used_by.contains("worker")).then(|| {
            (
                name,
                row.get(2)
                    .map(|c| c.text.trim().to_owned())
                    .unwrap_or_default(),
            )
        })
    })
    .collect()
}

/// `.env.example`: variable name to the value on its line (commented or not).
fn env_example() -> Vec<(String, String)> {
    repo_file(".env.example")
        .lines()
        .filter_map(|l| {
            let l = l.trim_start_matches('#').trim();
            let (name, value) = l.split_once('=')?;
            (!name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .then(|| (name.to_owned(), value.to_owned()))
        })
        .collect()
}

fn declared() -> Vec<Var> {
    COMMON_VARS
        .into_iter()
        .chain(script_runner_api::config::VARS)
        .chain(script_runner_worker::config::VARS)
        .chain(blobs::config::VARS)
        .collect()
}

#[test]
fn every_variable_read_is_documented_in_both_places() {
    let documented: BTreeSet<String> = documented_defaults().into_iter().map(|(n, _)| n).collect();
    let example: BTreeSet<String> = env_example().into_iter().map(|(n, _)| n).collect();
    let read = names_read();
    assert!(
        read.len() > 25,
        "the recording lookup saw too little: {read:?}"
    );
    for name in &read {
        assert!(
            documented.contains(name),
            "{name} is read but not in {CONFIG_DOC}'s table"
        );
        assert!(
            example.contains(name),
            "{name} is read but not in .env.example"
        );
    }
    for v in declared() {
        assert!(
            read.contains(v.name),
            "{} is declared but never read",
            v.name
        );
    }
}

#[test]
fn every_declared_default_is_the_documented_one() {
    let documented = documented_defaults();
    let example = env_example();
    for v in declared() {
        let in_doc = documented
            .iter()
            .find(|(n, _)| n == v.name)
            .map(|(_, d)| d.as_str())
            .unwrap_or_default();
        let want = if v.default.is_empty() {
            "empty".to_owned()
        } else {
            format!("`{}`", v.default)
        };
        assert!(
            in_doc.starts_with(&want),
            "{CONFIG_DOC} gives {:?} as {}'s default; the code says {want}",
            in_doc,
            v.name
        );
        let in_example = example
            .iter()
            .find(|(n, _)| n == v.name)
            .map(|(_, d)| d.as_str());
        assert_eq!(
            in_example,
            Some(v.default),
            ".env.example gives another default for {}",
            v.name
        );
    }
}
