//! The runtime catalogue: runtime name -> container image.

use std::collections::BTreeMap;

/// The runtimes every deployment has unless `RUNTIME_IMAGES` says otherwise.
pub const DEFAULT_RUNTIMES: [(&str, &str); 3] = [
    ("node24", "node:24-slim"),
    ("python3.8", "python:3.8-slim"),
    ("python3.13", "python:3.13-slim"),
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuntimeError {
    #[error(
        "RUNTIME_IMAGES entry {0:?} is not of the form name=image (e.g. python3.13=python:3.13-slim)"
    )]
    BadEntry(String),
    #[error(
        "runtime name {0:?} is not allowed: use letters, digits, '.', '-' and '_' (at most 64)"
    )]
    BadName(String),
}

/// Configured runtimes, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeCatalog {
    images: BTreeMap<String, String>,
}

impl RuntimeCatalog {
    /// The defaults, with `RUNTIME_IMAGES` (`name=image,name=image`) replacing or
    /// adding entries. `None` or an empty string keeps the defaults.
    pub fn from_env_value(value: Option<&str>) -> Result<RuntimeCatalog, RuntimeError> {
        let mut catalog = RuntimeCatalog {
            images: DEFAULT_RUNTIMES
                .iter()
                .map(|(n, i)| ((*n).to_owned(), (*i).to_owned()))
                .collect(),
        };
        catalog
            .images
            .extend(RuntimeCatalog::overrides(value)?.images);
        Ok(catalog)
    }

    /// Only the entries `RUNTIME_IMAGES` lists, without the defaults: what a
    /// worker host overrides (say, a local mirror's tag) in the image the api
    /// recorded for a task.
    pub fn overrides(value: Option<&str>) -> Result<RuntimeCatalog, RuntimeError> {
        let mut images = BTreeMap::new();
        for entry in value
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (name, image) = entry
                .split_once('=')
                .map(|(n, i)| (n.trim(), i.trim()))
                .filter(|(n, i)| !n.is_empty() && !i.is_empty())
                .ok_or_else(|| RuntimeError::BadEntry(entry.to_owned()))?;
            let name_ok = name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
            if !name_ok {
                return Err(RuntimeError::BadName(name.to_owned()));
            }
            images.insert(name.to_owned(), image.to_owned());
        }
        Ok(RuntimeCatalog { images })
    }

    pub fn image(&self, runtime: &str) -> Option<&str> {
        self.images.get(runtime).map(String::as_str)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.images.keys().map(String::as_str)
    }

    /// `node24, python3.13, ...` for error messages and tool descriptions.
    pub fn names_list(&self) -> String {
        self.names().collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_three_spec_runtimes() {
        let c = RuntimeCatalog::from_env_value(None).ok();
        let c = c.as_ref();
        assert_eq!(c.and_then(|c| c.image("node24")), Some("node:24-slim"));
        assert_eq!(
            c.map(|c| c.names_list()),
            Some("node24, python3.13, python3.8".to_owned())
        );
    }

    #[test]
    fn env_value_replaces_and_adds() {
        let c = RuntimeCatalog::from_env_value(Some("node24=local/node, ruby3=ruby:3")).ok();
        assert_eq!(
            c.as_ref().and_then(|c| c.image("node24")),
            Some("local/node")
        );
        assert_eq!(c.as_ref().and_then(|c| c.image("ruby3")), Some("ruby:3"));
        assert_eq!(
            c.as_ref().and_then(|c| c.image("python3.8")),
            Some("python:3.8-slim")
        );
    }

    #[test]
    fn overrides_hold_only_what_the_variable_lists() {
        let o = RuntimeCatalog::overrides(Some("node24=mirror/node:24")).ok();
        assert_eq!(
            o.as_ref().and_then(|c| c.image("node24")),
            Some("mirror/node:24")
        );
        assert_eq!(o.as_ref().and_then(|c| c.image("python3.13")), None);
        assert_eq!(
            RuntimeCatalog::overrides(None)
                .ok()
                .map(|c| c.names().count()),
            Some(0)
        );
    }

    #[test]
    fn malformed_entries_are_refused_with_the_entry_named() {
        assert_eq!(
            RuntimeCatalog::from_env_value(Some("node24")),
            Err(RuntimeError::BadEntry("node24".into()))
        );
        assert_eq!(
            RuntimeCatalog::from_env_value(Some("a b=x")),
            Err(RuntimeError::BadName("a b".into()))
        );
    }
}
