//! A worker's name: its consumer name in the jobs stream, the label on its
//! containers, and a part of the names of its directories under `TASKS_DIR`
//! (`cache-<worker>`, `pool-<worker>`). `WORKER_NAME` is checked at start, but a
//! name read from Redis (`Keys::workers`, which any worker's Redis user may
//! add to) is whatever was written there; so every name that becomes a path is
//! a `WorkerName`, made only by `WorkerName::parse`, and a name that does not
//! parse never becomes one.

use std::fmt;

/// A worker name that is safe as one path component: ASCII letters, digits,
/// `.`, `-` and `_`, not empty, and neither `.` nor `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerName(String);

/// Why a name cannot be a worker's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "worker name {0:?} is not allowed: use letters, digits, '.', '-' and '_' \
     (not empty, and not '.' or '..')"
)]
pub struct BadWorkerName(pub String);

impl WorkerName {
    /// `name` if it is a worker name; the one check for `WORKER_NAME` and for
    /// names read from Redis alike.
    pub fn parse(name: &str) -> Result<WorkerName, BadWorkerName> {
        let alphabet = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if alphabet && !matches!(name, "" | "." | "..") {
            Ok(WorkerName(name.to_owned()))
        } else {
            Err(BadWorkerName(name.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for WorkerName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_the_alphabet_are_worker_names() {
        for ok in [
            "w1",
            "worker-a.example.com",
            "main-t1a2b3c4",
            "a_b",
            "...",
            ".x",
            "x..y",
        ] {
            assert_eq!(
                WorkerName::parse(ok).map(|n| n.to_string()),
                Ok(ok.to_owned())
            );
        }
    }

    #[test]
    fn nothing_that_could_leave_its_directory_is_a_worker_name() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "../../etc",
            "x/../../y",
            "/etc",
            "a/b",
            "a\\b",
            "a b",
            "a\0b",
            "a\nb",
            "é",
            "*",
        ] {
            assert_eq!(
                WorkerName::parse(bad),
                Err(BadWorkerName(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_refusal_says_what_is_allowed() {
        let e = WorkerName::parse("../x").map(|_| ()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "worker name \"../x\" is not allowed: use letters, digits, '.', '-' and '_' \
             (not empty, and not '.' or '..')"
        );
    }
}
