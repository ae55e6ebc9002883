//! The configuration as documented is the configuration as coded: every variable
//! either binary reads is in README.md's table and in `.env.example`, and each
//! literal default declared in code is the default both state.

use std::cell::RefCell;
use std::collections::BTreeSet;

use shared::envvar::{COMMON_VARS, Var};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn repo_file(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names each binary asks for when it loads its config.
fn names_read() -> BTreeSet<String> {
    let seen = RefCell::new(BTreeSet::new());
    let record = |name: &str| {
        seen.borrow_mut().insert(name.to_owned());
        (name == "SCRIPT_RUNNER_TOKEN").then(|| TOKEN.to_owned())
    };
    script_runner_api::Config::from_lookup(record).expect("api defaults load");
    script_runner_worker::Config::from_lookup(record).expect("worker defaults load");
    seen.into_inner()
}

/// The README's configuration table: variable name to its default column.
fn readme_defaults() -> Vec<(String, String)> {
    repo_file("README.md")
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            // | `NAME` | used by | default | meaning |
            let name = cols.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let used_by = cols.get(2)?;
            (name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && (used_by.contains("api") || used_by.contains("worker")))
            .then(|| {
                (
                    name.to_owned(),
                    cols.get(3).copied().unwrap_or("").to_owned(),
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
            (!name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
                .then(|| (name.to_owned(), value.to_owned()))
        })
        .collect()
}

fn declared() -> Vec<Var> {
    COMMON_VARS
        .into_iter()
        .chain(script_runner_api::config::VARS)
        .chain(script_runner_worker::config::VARS)
        .collect()
}

#[test]
fn every_variable_read_is_documented_in_both_places() {
    let readme: BTreeSet<String> = readme_defaults().into_iter().map(|(n, _)| n).collect();
    let example: BTreeSet<String> = env_example().into_iter().map(|(n, _)| n).collect();
    let read = names_read();
    assert!(
        read.len() > 25,
        "the recording lookup saw too little: {read:?}"
    );
    for name in &read {
        assert!(
            readme.contains(name),
            "{name} is read but not in README's table"
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
    let readme = readme_defaults();
    let example = env_example();
    for v in declared() {
        let in_readme = readme
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
            in_readme.starts_with(&want),
            "README gives {:?} as {}'s default; the code says {want}",
            in_readme,
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
