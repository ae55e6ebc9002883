//! The runtime catalogue: runtime name -> container image.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;

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

/// The image [`DEFAULT_RUNTIMES`] gives `runtime`, if it is one of them.
pub fn default_image(runtime: &str) -> Option<&'static str> {
    DEFAULT_RUNTIMES
        .iter()
        .find(|(n, _)| *n == runtime)
        .map(|(_, i)| *i)
}

/// Why a worker refuses to run a task record: what it names is outside the
/// worker's catalogue. The sentence is the task's reason, shown to clients.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageRefusal {
    #[error("refused: runtime {runtime:?} is not in this worker's catalogue ({known})")]
    UnknownRuntime { runtime: String, known: String },
    #[error(
        "refused: the task's record names image {recorded:?} for runtime {runtime}; \
         this worker accepts only {accepted} for it"
    )]
    ImageNotInCatalogue {
        runtime: String,
        recorded: String,
        accepted: String,
    },
}

/// A runtime's name (`python3.13`): what a client asks for, a task record
/// stores, and a worker's catalogue and warm pool are keyed by. A catalogue
/// makes one from a name it holds ([`RuntimeCatalog::lookup`]); a record's
/// field is read back as one ([`RuntimeName::from_stored`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuntimeName(String);

impl RuntimeName {
    /// A record's `runtime` field: what the api wrote from its catalogue.
    /// Whether this worker's catalogue has it is [`RuntimeCatalog::resolve`]'s.
    pub fn from_stored(name: &str) -> RuntimeName {
        RuntimeName(name.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RuntimeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// So a catalogue is looked up by a client's text without making a name first.
impl Borrow<str> for RuntimeName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// Configured runtimes, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeCatalog {
    images: BTreeMap<RuntimeName, String>,
}

impl RuntimeCatalog {
    /// The catalogue `RUNTIME_IMAGES` makes, read through `var` (a binary's
    /// lookup), as both binaries read it.
    pub fn from_lookup(
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<RuntimeCatalog, RuntimeError> {
        RuntimeCatalog::from_env_value(Some(&crate::envvar::RUNTIME_IMAGES.get(var)))
    }

    /// The defaults, with `RUNTIME_IMAGES` (`name=image,name=image`) replacing or
    /// adding entries. `None` or an empty string keeps the defaults.
    pub fn from_env_value(value: Option<&str>) -> Result<RuntimeCatalog, RuntimeError> {
        let mut catalog = RuntimeCatalog {
            images: DEFAULT_RUNTIMES
                .iter()
                .map(|(n, i)| (RuntimeName((*n).to_owned()), (*i).to_owned()))
                .collect(),
        };
        catalog
            .images
            .extend(RuntimeCatalog::overrides(value)?.images);
        Ok(catalog)
    }

    /// Only the entries `RUNTIME_IMAGES` lists, without the defaults.
    fn overrides(value: Option<&str>) -> Result<RuntimeCatalog, RuntimeError> {
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
            images.insert(RuntimeName(name.to_owned()), image.to_owned());
        }
        Ok(RuntimeCatalog { images })
    }

    /// The image a worker runs for a task recorded with `runtime` and
    /// `recorded_image`: always this catalogue's image for the runtime, never the
    /// record's. `self` is the worker's catalogue ([`RuntimeCatalog::from_env_value`]:
    /// the defaults and its `RUNTIME_IMAGES`). The record is refused when its
    /// runtime is not here, or its image is neither this catalogue's for the
    /// runtime nor the runtime's default (what an api without an override
    /// records), so a record written by anything but an api that agrees with
    /// this worker cannot choose what runs. A pinned digest (`NAME:TAG@sha256:…`,
    /// deploy/pin-images.sh) is not compared: a worker host still on last
    /// week's pin runs its own bytes for the same image instead of refusing
    /// every task the api records with this week's.
    pub fn resolve(
        &self,
        runtime: &RuntimeName,
        recorded_image: &str,
    ) -> Result<&str, ImageRefusal> {
        let Some(image) = self.image(runtime) else {
            return Err(ImageRefusal::UnknownRuntime {
                runtime: runtime.to_string(),
                known: self.names_list(),
            });
        };
        let default = default_image(runtime.as_str());
        let unpinned = |r: &str| r.split_once('@').map_or(r, |(name, _)| name).to_owned();
        let recorded = unpinned(recorded_image);
        if recorded == unpinned(image) || default.is_some_and(|d| unpinned(d) == recorded) {
            return Ok(image);
        }
        let accepted = match default {
            Some(d) if d != image => format!("{image:?} or {d:?}"),
            _ => format!("{image:?}"),
        };
        Err(ImageRefusal::ImageNotInCatalogue {
            runtime: runtime.to_string(),
            recorded: recorded_image.to_owned(),
            accepted,
        })
    }

    pub fn image(&self, runtime: &RuntimeName) -> Option<&str> {
        self.images.get(runtime).map(String::as_str)
    }

    /// The runtime a client named, and its image, if this catalogue has it.
    pub fn lookup(&self, name: &str) -> Option<(&RuntimeName, &str)> {
        self.images
            .get_key_value(name)
            .map(|(n, i)| (n, i.as_str()))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.images.keys().map(RuntimeName::as_str)
    }

    /// `node24, python3.13, ...` for error messages and tool descriptions.
    pub fn names_list(&self) -> String {
        self.names().collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_image_pinned_by_digest_is_taken_whole() {
        let pinned =
            "python@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let c = RuntimeCatalog::from_env_value(Some(&format!("python3.13={pinned}"))).unwrap();
        assert_eq!(c.lookup("python3.13").map(|(_, image)| image), Some(pinned));
    }

    use super::*;

    #[test]
    fn defaults_are_the_three_spec_runtimes() {
        let c = RuntimeCatalog::from_env_value(None).ok();
        let c = c.as_ref();
        assert_eq!(
            c.and_then(|c| c.lookup("node24").map(|(_, i)| i)),
            Some("node:24-slim")
        );
        assert_eq!(
            c.map(|c| c.names_list()),
            Some("node24, python3.13, python3.8".to_owned())
        );
    }

    #[test]
    fn env_value_replaces_and_adds() {
        let c = RuntimeCatalog::from_env_value(Some("node24=local/node, ruby3=ruby:3")).ok();
        assert_eq!(
            c.as_ref().and_then(|c| c.lookup("node24").map(|(_, i)| i)),
            Some("local/node")
        );
        assert_eq!(
            c.as_ref().and_then(|c| c.lookup("ruby3").map(|(_, i)| i)),
            Some("ruby:3")
        );
        assert_eq!(
            c.as_ref()
                .and_then(|c| c.lookup("python3.8").map(|(_, i)| i)),
            Some("python:3.8-slim")
        );
    }

    #[test]
    fn overrides_hold_only_what_the_variable_lists() {
        let o = RuntimeCatalog::overrides(Some("node24=mirror/node:24")).ok();
        assert_eq!(
            o.as_ref().and_then(|c| c.lookup("node24").map(|(_, i)| i)),
            Some("mirror/node:24")
        );
        assert_eq!(
            o.as_ref()
                .and_then(|c| c.lookup("python3.13").map(|(_, i)| i)),
            None
        );
        assert_eq!(
            RuntimeCatalog::overrides(None)
                .ok()
                .map(|c| c.names().count()),
            Some(0)
        );
    }

    #[test]
    fn a_worker_runs_its_own_image_and_accepts_only_the_default_or_its_override() {
        let c = RuntimeCatalog::from_env_value(Some("node24=mirror/node:24,ruby3=ruby:3")).ok();
        let resolve = |r: &str, i: &str| {
            c.as_ref().map(|c| {
                c.resolve(&RuntimeName::from_stored(r), i)
                    .map(str::to_owned)
            })
        };
        // The override runs whether the api recorded the default or the override.
        assert_eq!(
            resolve("node24", "node:24-slim"),
            Some(Ok("mirror/node:24".into()))
        );
        assert_eq!(
            resolve("node24", "mirror/node:24"),
            Some(Ok("mirror/node:24".into()))
        );
        assert_eq!(
            resolve("python3.13", "python:3.13-slim"),
            Some(Ok("python:3.13-slim".into()))
        );
        assert_eq!(resolve("ruby3", "ruby:3"), Some(Ok("ruby:3".into())));
        let refused = resolve("node24", "attacker.invalid/evil:1")
            .and_then(Result::err)
            .map(|e| e.to_string());
        assert_eq!(
            refused.as_deref(),
            Some(
                "refused: the task's record names image \"attacker.invalid/evil:1\" for runtime \
                 node24; this worker accepts only \"mirror/node:24\" or \"node:24-slim\" for it"
            )
        );
        // Pins are not compared: a worker on another week's digest runs its
        // own pin of the same image; another image stays refused, pinned or not.
        let pinned =
            RuntimeCatalog::from_env_value(Some("python3.13=python:3.13-slim@sha256:aa")).ok();
        let resolve_pinned = |i: &str| {
            pinned.as_ref().map(|c| {
                c.resolve(&RuntimeName::from_stored("python3.13"), i)
                    .map(str::to_owned)
            })
        };
        for recorded in ["python:3.13-slim@sha256:bb", "python:3.13-slim"] {
            assert_eq!(
                resolve_pinned(recorded),
                Some(Ok("python:3.13-slim@sha256:aa".into())),
                "{recorded}"
            );
        }
        assert!(matches!(
            resolve_pinned("attacker.invalid/evil:1@sha256:aa"),
            Some(Err(ImageRefusal::ImageNotInCatalogue { .. }))
        ));
        // Another runtime's image is not this runtime's.
        assert!(matches!(
            resolve("python3.13", "python:3.8-slim"),
            Some(Err(ImageRefusal::ImageNotInCatalogue { .. }))
        ));
        assert_eq!(
            resolve("cobol", "python:3.13-slim").and_then(Result::err),
            Some(ImageRefusal::UnknownRuntime {
                runtime: "cobol".into(),
                known: "node24, python3.13, python3.8, ruby3".into()
            })
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
