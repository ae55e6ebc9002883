//! Parsing of configuration values. Each binary reads its environment and hands the
//! raw strings here, so both report a bad value the same way: naming the variable,
//! the value and what is allowed.

use std::fmt::Display;
use std::str::FromStr;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{name}={value:?} is not valid: {expected}")]
pub struct VarError {
    pub name: String,
    pub value: String,
    pub expected: String,
}

impl VarError {
    pub fn new(name: &str, value: &str, expected: impl Display) -> VarError {
        VarError {
            name: name.to_owned(),
            value: value.to_owned(),
            expected: expected.to_string(),
        }
    }
}

/// `raw` parsed as `T`, or `default` when unset or blank.
pub fn parse_or<T: FromStr>(
    name: &str,
    raw: Option<&str>,
    default: T,
    expected: &str,
) -> Result<T, VarError> {
    match raw.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| VarError::new(name, v, expected)),
    }
}

/// A whole number in `min..=max`, or `default` when unset.
pub fn parse_range(
    name: &str,
    raw: Option<&str>,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, VarError> {
    let expected = format!("a whole number from {min} to {max}");
    let v: u64 = parse_or(name, raw, default, &expected)?;
    if (min..=max).contains(&v) {
        Ok(v)
    } else {
        Err(VarError::new(name, &v.to_string(), expected))
    }
}

/// A comma-separated list with blanks dropped.
pub fn parse_list(raw: Option<&str>, default: &str) -> Vec<String> {
    raw.filter(|v| !v.trim().is_empty())
        .unwrap_or(default)
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `get` with a blank value counting as unset, as in most `.env` use: every
/// variable then falls back to its default the same way in both binaries.
pub fn non_blank(get: impl Fn(&str) -> Option<String>) -> impl Fn(&str) -> Option<String> {
    move |name| get(name).filter(|v| !v.trim().is_empty())
}

/// The settings api and worker must agree on, read the same way by both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Common {
    /// `REDIS_URL` (default `redis://127.0.0.1:6379`).
    pub redis_url: String,
    /// `REDIS_KEY_PREFIX` (default `sr`).
    pub keys: crate::Keys,
    /// `TASK_RETENTION_SECONDS`: how long a finished task's record is kept
    /// (default a day, 60 s to a year).
    pub retention_seconds: u64,
}

impl Common {
    /// `var` returns a variable's value, `None` when unset or blank.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Common, VarError> {
        Ok(Common {
            redis_url: var("REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
            keys: crate::Keys::new(
                var("REDIS_KEY_PREFIX").unwrap_or_else(|| crate::Keys::DEFAULT_PREFIX.into()),
            ),
            retention_seconds: parse_range(
                "TASK_RETENTION_SECONDS",
                var("TASK_RETENTION_SECONDS").as_deref(),
                86_400,
                60,
                365 * 86_400,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_names_the_variable_and_the_bounds() {
        assert_eq!(parse_range("X", None, 5, 1, 10), Ok(5));
        assert_eq!(parse_range("X", Some(" 7 "), 5, 1, 10), Ok(7));
        let e = parse_range("X", Some("0"), 5, 1, 10)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("X=\"0\" is not valid: a whole number from 1 to 10")
        );
        assert!(parse_range("X", Some("ten"), 5, 1, 10).is_err());
    }

    #[test]
    fn lists_drop_blanks() {
        assert_eq!(parse_list(Some("a, ,b"), "z"), ["a", "b"]);
        assert_eq!(parse_list(None, "z,y"), ["z", "y"]);
    }
}
