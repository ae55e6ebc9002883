//! Property tests of the input rules every client reaches: the zip checker, the
//! `env` and `collect` rules, the network names and the configuration parser.
//! Arbitrary input never panics; it is accepted exactly when an independent
//! statement of the rule says so; and refusals name what they refuse.

// Test code: a failed expectation is a panic (the workspace lints deny these in product code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::{Cursor, Write};

use proptest::prelude::*;
use script_runner_shared::envvar::Var;
use script_runner_shared::options::{
    CollectError, EnvError, MAX_COLLECT_PATTERN_LEN, MAX_COLLECT_PATTERNS, MAX_ENV_BYTES,
    MAX_ENV_VARS, Network, RESERVED_ENV, RESERVED_ENV_PREFIXES, check_collect, check_env,
};
use script_runner_shared::zipcheck::{ZipError, ZipLimits, check_zip};
use zip::write::SimpleFileOptions;

fn limits() -> ZipLimits {
    ZipLimits {
        max_entries: 100,
        max_expanded_bytes: 1 << 20,
        max_ratio: 200,
    }
}

/// A zip of files with these names (each holding its own name), or `None` when
/// the zip crate will not write one of them.
fn zip_with(names: &[String]) -> Option<Vec<u8>> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for name in names {
        w.start_file(name.as_str(), SimpleFileOptions::default())
            .ok()?;
        w.write_all(name.as_bytes()).ok()?;
    }
    Some(w.finish().ok()?.into_inner())
}

/// The rule, stated independently of `zipcheck`: a name is safe when it has no
/// NUL, does not start with a separator ('/' or '\'), and, split on either
/// separator and without empty and "." parts, is not empty and has no ".." and
/// no part whose second byte is ':' (a Windows drive). Then these are its parts.
fn safe_parts(name: &str) -> Option<Vec<&str>> {
    if name.contains('\0') || name.starts_with(['/', '\\']) {
        return None;
    }
    let parts: Vec<&str> = name
        .split(['/', '\\'])
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    let bad = parts.is_empty()
        || parts
            .iter()
            .any(|p| *p == ".." || p.as_bytes().get(1) == Some(&b':'));
    (!bad).then_some(parts)
}

/// Names built from parts that matter to the rule, joined by either separator.
fn entry_name() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        Just("a"),
        Just("b.txt"),
        Just(".."),
        Just("."),
        Just(""),
        Just("..."),
        Just("C:"),
        Just("c:x"),
        Just("é"),
        Just("a\0b"),
        Just(".hidden"),
    ];
    let lead = prop_oneof![Just(""), Just("/"), Just("\\"), Just("./")];
    let seps = prop::collection::vec(prop_oneof![Just("/"), Just("\\")], 4);
    (lead, prop::collection::vec(part, 1..5), seps).prop_map(|(lead, parts, seps)| {
        let mut name = lead.to_owned();
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                name.push_str(seps[i - 1]);
            }
            name.push_str(p);
        }
        name
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_are_refused_without_a_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
        with_signature in any::<bool>(),
    ) {
        let mut data = if with_signature { b"PK\x03\x04".to_vec() } else { Vec::new() };
        data.extend(bytes);
        // Whatever it is, the answer is a value, never a panic.
        let _ = check_zip(&data, &limits());
    }

    #[test]
    fn damaged_archives_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let names = ["a.txt".to_owned(), "dir/b.txt".to_owned()];
        let mut zip = zip_with(&names).expect("zip");
        for (at, byte) in flips {
            let i = at.index(zip.len());
            zip[i] ^= byte;
        }
        if truncate {
            zip.truncate(cut.index(zip.len()));
        }
        let _ = check_zip(&zip, &limits());
    }

    #[test]
    fn archives_are_accepted_exactly_when_every_name_is_safe(
        names in prop::collection::btree_set(entry_name(), 1..6),
    ) {
        let names: Vec<String> = names.into_iter().collect();
        let Some(zip) = zip_with(&names) else {
            return Err(TestCaseError::reject("the zip crate will not write these names"));
        };
        let expected: Vec<Option<Vec<&str>>> = names.iter().map(|n| safe_parts(n)).collect();
        match check_zip(&zip, &limits()) {
            Ok(entries) => {
                prop_assert!(expected.iter().all(Option::is_some), "accepted {names:?}");
                // Accepted entries keep their order and their parts.
                for (entry, parts) in entries.iter().zip(&expected) {
                    let got: Vec<String> = entry
                        .path
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect();
                    prop_assert_eq!(Some(got.iter().map(String::as_str).collect()), parts.clone());
                }
            }
            Err(ZipError::UnsafePath(name)) => {
                // The first unsafe name, in archive order, is the one named.
                let first = names.iter().zip(&expected).find(|(_, p)| p.is_none());
                prop_assert_eq!(Some(&name), first.map(|(n, _)| n), "for {:?}", names);
            }
            Err(other) => prop_assert!(false, "{names:?}: unexpected {other}"),
        }
    }

    #[test]
    fn the_entry_cap_holds_at_every_count(count in 0usize..40, max in 1usize..40) {
        let names: Vec<String> = (0..count).map(|i| format!("f{i}")).collect();
        let zip = zip_with(&names).expect("zip");
        let limits = ZipLimits { max_entries: max, ..limits() };
        match check_zip(&zip, &limits) {
            Ok(entries) => prop_assert!(count <= max && entries.len() == count),
            Err(ZipError::TooManyEntries { count: c, max: m }) => {
                prop_assert!(count > max && c == count && m == max)
            }
            Err(other) => prop_assert!(false, "unexpected {other}"),
        }
    }

    #[test]
    fn env_maps_are_accepted_exactly_by_the_rule_and_refusals_name_it(
        env in prop::collection::btree_map(
            prop_oneof![
                "[A-Za-z_][A-Za-z0-9_]{0,6}",
                "[A-Za-z0-9_$-]{0,6}",
                Just("PATH".to_owned()),
                Just("SR_X".to_owned()),
                Just("SCRIPT_RUNNER_TOKEN".to_owned()),
            ],
            prop_oneof![".{0,8}", Just("a\0b".to_owned()), Just("x".repeat(MAX_ENV_BYTES / 2))],
            0..(MAX_ENV_VARS + 4),
        ),
    ) {
        let result = check_env(&env);
        let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
        let expected = if env.len() > MAX_ENV_VARS {
            Err(EnvError::TooMany(env.len()))
        } else if bytes > MAX_ENV_BYTES {
            Err(EnvError::TooLarge(bytes))
        } else {
            env_first_problem(&env).map_or(Ok(()), Err)
        };
        prop_assert_eq!(&result, &expected);
        if let Err(e) = result {
            prop_assert!(e.to_string().starts_with("env "), "{e}");
        }
    }

    #[test]
    fn collect_lists_are_accepted_exactly_by_the_rule_and_refusals_name_it(
        patterns in prop::collection::vec(
            prop_oneof![
                "[a-z*?/.]{0,12}",
                ".{0,6}",
                Just("../x".to_owned()),
                Just("/etc".to_owned()),
                Just("a\nb".to_owned()),
                Just("x".repeat(MAX_COLLECT_PATTERN_LEN + 1)),
            ],
            0..(MAX_COLLECT_PATTERNS + 3),
        ),
    ) {
        let bad = |p: &String| {
            p.trim().is_empty()
                || p.len() > MAX_COLLECT_PATTERN_LEN
                || p.starts_with('/')
                || p.contains(['\n', '\r', '\0'])
                || p.split('/').any(|c| c == "..")
        };
        let expected = if patterns.len() > MAX_COLLECT_PATTERNS {
            Err(CollectError::TooMany(patterns.len()))
        } else if let Some(p) = patterns.iter().find(|p| bad(p)) {
            Err(CollectError::BadPattern(p.chars().take(80).collect()))
        } else {
            Ok(())
        };
        let result = check_collect(&patterns);
        prop_assert_eq!(&result, &expected);
        if let Err(e) = result {
            prop_assert!(e.to_string().starts_with("collect "), "{e}");
        }
    }

    #[test]
    fn network_names_round_trip_and_nothing_else_parses(s in ".{0,10}") {
        for n in [Network::Internet, Network::None] {
            prop_assert_eq!(n.as_str().parse::<Network>(), Ok(n));
        }
        let parsed = s.parse::<Network>();
        prop_assert_eq!(parsed.is_ok(), s == "internet" || s == "none");
    }

    #[test]
    fn whole_number_variables_parse_or_name_themselves(
        raw in prop_oneof!["[ 0-9a-z.+-]{0,24}", any::<u64>().prop_map(|n| n.to_string())],
        min in 0u64..100,
        span in 0u64..1_000_000,
    ) {
        const V: Var = Var::new("SOME_LIMIT", "5");
        let max = min + span;
        let lookup = |name: &str| (name == "SOME_LIMIT").then(|| raw.clone());
        let expected = raw.trim().parse::<u64>().ok().filter(|n| (min..=max).contains(n));
        match V.range(&lookup, min, max) {
            Ok(n) => prop_assert_eq!(Some(n), expected),
            Err(e) => {
                prop_assert_eq!(None, expected);
                prop_assert!(e.to_string().starts_with("SOME_LIMIT="), "{e}");
            }
        }
    }

    #[test]
    fn whole_numbers_in_range_round_trip(n in 0u64..1_000_000, pad in "[ \t]{0,3}") {
        const V: Var = Var::new("SOME_LIMIT", "5");
        let raw = format!("{pad}{n}{pad}");
        let lookup = |_: &str| Some(raw.clone());
        prop_assert_eq!(V.range(&lookup, 0, 1_000_000), Ok(n));
    }
}

/// The first problem with an `env` map within the count and size caps, in name
/// order: a bad name, a reserved name, or a NUL in the value.
fn env_first_problem(env: &BTreeMap<String, String>) -> Option<EnvError> {
    env.iter().find_map(|(name, value)| {
        let mut chars = name.chars();
        let good = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !good {
            Some(EnvError::BadName(name.clone()))
        } else if RESERVED_ENV.contains(&name.as_str())
            || RESERVED_ENV_PREFIXES.iter().any(|p| name.starts_with(p))
        {
            Some(EnvError::Reserved(name.clone()))
        } else if value.contains('\0') {
            Some(EnvError::NulInValue(name.clone()))
        } else {
            None
        }
    })
}
