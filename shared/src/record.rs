//! The task record: the hash under `Keys::task`, as one typed value.
//!
//! [`TaskRecord::to_fields`] and [`TaskRecord::from_fields`] are the only
//! mapping between the hash's field/value pairs and types; the api, the worker
//! and the ctl all go through them. This crate does no I/O, so they work on
//! pairs: the caller reads them (`HGETALL`, or `HMGET` of a field list) and
//! writes them (the SUBMIT script's ARGV).
//!
//! Partial reads: every field but the state is an `Option`, `None` when the
//! hash has no such field *or the read did not ask for it*. Each reader names
//! what it reads once (e.g. [`crate::view::STATUS_FIELDS`]), and reads only
//! what it asked for. The state is in every field list: a hash without one is
//! no task (never made, or expired), and `from_fields` says so with `Ok(None)`.

use std::collections::BTreeMap;

use crate::egress::{AllowList, EgressLog};
use crate::keys::Field;
use crate::options::{CacheUse, Network};
use crate::owner::Owner;
use crate::runtimes::RuntimeName;
use crate::task::{ReasonKind, TaskState};
use crate::workspace::WorkspaceId;

/// A task record, typed. Timestamps are Unix milliseconds by Redis's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    pub state: TaskState,
    pub runtime: Option<RuntimeName>,
    pub image: Option<String>,
    pub command: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub has_zip: Option<bool>,
    pub has_stdin: Option<bool>,
    pub env: Option<BTreeMap<String, String>>,
    pub network: Option<Network>,
    /// The `collect` patterns.
    pub collect: Option<Vec<String>>,
    /// What was collected: a `CollectedFiles` listing as JSON, kept as the
    /// worker wrote it (the api hands it on).
    pub files: Option<String>,
    pub created_at: Option<i64>,
    pub claimed_at: Option<i64>,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub last_output_at: Option<i64>,
    pub worker: Option<String>,
    pub entry: Option<String>,
    pub container: Option<String>,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
    pub reason_kind: Option<ReasonKind>,
    /// Raw bytes, as the worker keeps them (not necessarily UTF-8).
    pub stdout_tail: Option<Vec<u8>>,
    pub stderr_tail: Option<Vec<u8>>,
    pub stdout_bytes: Option<u64>,
    pub stderr_bytes: Option<u64>,
    /// Who submitted it: an API key or an OAuth subject. `None`: the admin
    /// key (whose tasks have no owner field), or not read.
    pub owner: Option<Owner>,
    pub usage_cpu_ms: Option<u64>,
    pub usage_peak_memory_bytes: Option<u64>,
    pub usage_workspace_bytes: Option<u64>,
    /// Whether the usage is the worker's estimate (see `Usage::estimated`).
    pub usage_estimated: Option<bool>,
    /// Whether the task uses its owner's dependency caches.
    pub cache: Option<CacheUse>,
    /// An `allow` task's hosts.
    pub egress_allow: Option<AllowList>,
    /// What the egress proxy saw of an `allow` task.
    pub egress_log: Option<EgressLog>,
    /// The api's signature of the spec (`shared::spec`), as stored.
    pub spec_signature: Option<String>,
    pub workspace_id: Option<WorkspaceId>,
    /// The version it starts from (0: empty).
    pub workspace_base: Option<u64>,
    /// The version it made.
    pub workspace_version: Option<u64>,
    /// Why it made none.
    pub workspace_note: Option<String>,
    /// A `write_files` task's deletes (`Some`, even if empty, makes the task
    /// that edit).
    pub edit_deletes: Option<Vec<String>>,
}

/// A field whose stored value does not read as its type. Names the field, so
/// whoever meets it knows where to look (`HGET <task key> <field>`).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("the task record has no {0} field")]
    Missing(Field),
    #[error("the task record's {field} field is not valid: {value:?}")]
    Malformed { field: Field, value: String },
    #[error("the task record's {field} field is not valid JSON: {source}")]
    BadJson {
        field: Field,
        #[source]
        source: serde_json::Error,
    },
}

impl RecordError {
    /// `value`, or `Missing(field)`: for a reader that needs a field.
    pub fn required<T>(value: Option<T>, field: Field) -> Result<T, RecordError> {
        value.ok_or(RecordError::Missing(field))
    }
}

impl TaskRecord {
    /// A record in `state` with no other field.
    pub fn new(state: TaskState) -> TaskRecord {
        TaskRecord {
            state,
            runtime: None,
            image: None,
            command: None,
            timeout_seconds: None,
            has_zip: None,
            has_stdin: None,
            env: None,
            network: None,
            collect: None,
            files: None,
            created_at: None,
            claimed_at: None,
            started_at: None,
            finished_at: None,
            last_output_at: None,
            worker: None,
            entry: None,
            container: None,
            exit_code: None,
            reason: None,
            reason_kind: None,
            stdout_tail: None,
            stderr_tail: None,
            stdout_bytes: None,
            stderr_bytes: None,
            owner: None,
            usage_cpu_ms: None,
            usage_peak_memory_bytes: None,
            usage_workspace_bytes: None,
            usage_estimated: None,
            cache: None,
            egress_allow: None,
            egress_log: None,
            spec_signature: None,
            workspace_id: None,
            workspace_base: None,
            workspace_version: None,
            workspace_note: None,
            edit_deletes: None,
        }
    }

    /// The hash's field/value pairs for every field that is set, in `Field`
    /// order.
    pub fn to_fields(&self) -> Vec<(Field, Vec<u8>)> {
        Field::ALL
            .iter()
            .filter_map(|&f| self.value(f).map(|v| (f, v)))
            .collect()
    }

    /// A record from the pairs a read returned (absent fields left out); `None`
    /// when there is no state among them (no such task).
    pub fn from_fields<V: AsRef<[u8]>>(
        pairs: impl IntoIterator<Item = (Field, V)>,
    ) -> Result<Option<TaskRecord>, RecordError> {
        let mut state = None;
        let mut rest = Vec::new();
        for (f, v) in pairs {
            if f == Field::State {
                state = Some(parse(f, v.as_ref())?);
            } else {
                rest.push((f, v));
            }
        }
        let Some(state) = state else {
            return Ok(None);
        };
        let mut record = TaskRecord::new(state);
        for (f, v) in rest {
            record.set(f, v.as_ref())?;
        }
        Ok(Some(record))
    }

    /// A record from an `HMGET` of `fields`: `values[i]` is `fields[i]`'s.
    pub fn from_values<V: AsRef<[u8]>>(
        fields: &[Field],
        values: impl IntoIterator<Item = Option<V>>,
    ) -> Result<Option<TaskRecord>, RecordError> {
        TaskRecord::from_fields(
            fields
                .iter()
                .zip(values)
                .filter_map(|(&f, v)| v.map(|v| (f, v))),
        )
    }

    /// A record from an `HGETALL`, by field name. Names this version does not
    /// know are skipped, so a newer writer may add fields.
    pub fn from_hash<K: AsRef<str>, V: AsRef<[u8]>>(
        hash: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Option<TaskRecord>, RecordError> {
        TaskRecord::from_fields(
            hash.into_iter()
                .filter_map(|(k, v)| k.as_ref().parse::<Field>().ok().map(|f| (f, v))),
        )
    }

    /// One field's stored value; `None` if it is not set.
    pub fn value(&self, f: Field) -> Option<Vec<u8>> {
        let text = |s: &Option<String>| s.as_ref().map(|s| s.as_bytes().to_vec());
        let int = |n: Option<i64>| n.map(|n| n.to_string().into_bytes());
        let count = |n: Option<u64>| n.map(|n| n.to_string().into_bytes());
        let flag = |b: Option<bool>| b.map(|b| if b { b"1".to_vec() } else { b"0".to_vec() });
        match f {
            Field::State => Some(self.state.as_str().as_bytes().to_vec()),
            Field::Runtime => self
                .runtime
                .as_ref()
                .map(|r| r.as_str().as_bytes().to_vec()),
            Field::Image => text(&self.image),
            Field::Command => text(&self.command),
            Field::TimeoutSeconds => count(self.timeout_seconds),
            Field::HasZip => flag(self.has_zip),
            Field::HasStdin => flag(self.has_stdin),
            // Built as `Value`s, whose text form cannot fail, unlike `to_string`.
            Field::Env => self.env.as_ref().map(|env| {
                let map = env
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
                    .collect::<serde_json::Map<_, _>>();
                serde_json::Value::Object(map).to_string().into_bytes()
            }),
            Field::Network => self.network.map(|n| n.as_str().as_bytes().to_vec()),
            Field::Collect => self
                .collect
                .as_ref()
                .map(|c| serde_json::Value::from(c.clone()).to_string().into_bytes()),
            Field::Files => text(&self.files),
            Field::CreatedAt => int(self.created_at),
            Field::ClaimedAt => int(self.claimed_at),
            Field::StartedAt => int(self.started_at),
            Field::FinishedAt => int(self.finished_at),
            Field::LastOutputAt => int(self.last_output_at),
            Field::Worker => text(&self.worker),
            Field::Entry => text(&self.entry),
            Field::Container => text(&self.container),
            Field::ExitCode => int(self.exit_code),
            Field::Reason => text(&self.reason),
            Field::ReasonKind => self.reason_kind.map(|k| k.as_str().as_bytes().to_vec()),
            Field::StdoutTail => self.stdout_tail.clone(),
            Field::StderrTail => self.stderr_tail.clone(),
            Field::StdoutBytes => count(self.stdout_bytes),
            Field::StderrBytes => count(self.stderr_bytes),
            // The admin's tasks have no owner field.
            Field::Owner => self
                .owner
                .as_ref()
                .filter(|o| !o.is_admin())
                .map(|o| o.as_stored().as_bytes().to_vec()),
            Field::UsageCpuMs => count(self.usage_cpu_ms),
            Field::UsagePeakMemoryBytes => count(self.usage_peak_memory_bytes),
            Field::UsageWorkspaceBytes => count(self.usage_workspace_bytes),
            Field::UsageEstimated => flag(self.usage_estimated),
            Field::Cache => self.cache.map(|c| c.as_str().as_bytes().to_vec()),
            Field::EgressAllow => self
                .egress_allow
                .as_ref()
                .map(|l| l.to_stored().into_bytes()),
            // A log of plain strings and numbers: its JSON form cannot fail.
            Field::EgressLog => self
                .egress_log
                .as_ref()
                .and_then(|l| serde_json::to_vec(l).ok()),
            Field::SpecSignature => text(&self.spec_signature),
            Field::WorkspaceId => self.workspace_id.map(|w| w.to_string().into_bytes()),
            Field::WorkspaceBase => count(self.workspace_base),
            Field::WorkspaceVersion => count(self.workspace_version),
            Field::WorkspaceNote => text(&self.workspace_note),
            Field::EditDeletes => self
                .edit_deletes
                .as_ref()
                .map(|d| serde_json::Value::from(d.clone()).to_string().into_bytes()),
        }
    }

    /// Reads one stored value into its field.
    fn set(&mut self, f: Field, v: &[u8]) -> Result<(), RecordError> {
        // Free text is shown, never parsed: a stray invalid byte is replaced
        // rather than making the whole record unreadable.
        let text = || Some(String::from_utf8_lossy(v).into_owned());
        match f {
            Field::State => self.state = parse(f, v)?,
            Field::Runtime => self.runtime = text().map(|n| RuntimeName::from_stored(&n)),
            Field::Image => self.image = text(),
            Field::Command => self.command = text(),
            Field::TimeoutSeconds => self.timeout_seconds = Some(parse(f, v)?),
            Field::HasZip => self.has_zip = Some(flag(f, v)?),
            Field::HasStdin => self.has_stdin = Some(flag(f, v)?),
            Field::Env => self.env = Some(json(f, v)?),
            Field::Network => self.network = Some(parse(f, v)?),
            Field::Collect => self.collect = Some(json(f, v)?),
            Field::Files => self.files = text(),
            Field::CreatedAt => self.created_at = Some(parse(f, v)?),
            Field::ClaimedAt => self.claimed_at = Some(parse(f, v)?),
            Field::StartedAt => self.started_at = Some(parse(f, v)?),
            Field::FinishedAt => self.finished_at = Some(parse(f, v)?),
            Field::LastOutputAt => self.last_output_at = Some(parse(f, v)?),
            Field::Worker => self.worker = text(),
            Field::Entry => self.entry = text(),
            Field::Container => self.container = text(),
            Field::ExitCode => self.exit_code = Some(parse(f, v)?),
            Field::Reason => self.reason = text(),
            Field::ReasonKind => self.reason_kind = Some(parse(f, v)?),
            Field::StdoutTail => self.stdout_tail = Some(v.to_vec()),
            Field::StderrTail => self.stderr_tail = Some(v.to_vec()),
            Field::StdoutBytes => self.stdout_bytes = Some(parse(f, v)?),
            Field::StderrBytes => self.stderr_bytes = Some(parse(f, v)?),
            Field::Owner => self.owner = text().map(|name| Owner::from_stored(&name)),
            Field::UsageCpuMs => self.usage_cpu_ms = Some(parse(f, v)?),
            Field::UsagePeakMemoryBytes => self.usage_peak_memory_bytes = Some(parse(f, v)?),
            Field::UsageWorkspaceBytes => self.usage_workspace_bytes = Some(parse(f, v)?),
            Field::UsageEstimated => self.usage_estimated = Some(flag(f, v)?),
            Field::Cache => self.cache = Some(parse(f, v)?),
            Field::EgressAllow => {
                let list = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| AllowList::from_stored(s).ok());
                self.egress_allow = Some(list.ok_or_else(|| malformed(f, v))?);
            }
            Field::EgressLog => self.egress_log = Some(json(f, v)?),
            Field::SpecSignature => self.spec_signature = text(),
            Field::WorkspaceId => {
                let id = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| WorkspaceId::parse(s).ok());
                self.workspace_id = Some(id.ok_or_else(|| malformed(f, v))?);
            }
            Field::WorkspaceBase => self.workspace_base = Some(parse(f, v)?),
            Field::WorkspaceVersion => self.workspace_version = Some(parse(f, v)?),
            Field::WorkspaceNote => self.workspace_note = text(),
            Field::EditDeletes => self.edit_deletes = Some(json(f, v)?),
        }
        Ok(())
    }
}

fn malformed(field: Field, v: &[u8]) -> RecordError {
    RecordError::Malformed {
        field,
        value: String::from_utf8_lossy(v).chars().take(80).collect(),
    }
}

/// A value in its `FromStr` form (numbers, states, kinds, networks).
fn parse<T: std::str::FromStr>(field: Field, v: &[u8]) -> Result<T, RecordError> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed(field, v))
}

/// `1` or `0`.
fn flag(field: Field, v: &[u8]) -> Result<bool, RecordError> {
    match v {
        b"1" => Ok(true),
        b"0" => Ok(false),
        _ => Err(malformed(field, v)),
    }
}

fn json<T: serde::de::DeserializeOwned>(field: Field, v: &[u8]) -> Result<T, RecordError> {
    serde_json::from_slice(v).map_err(|source| RecordError::BadJson { field, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> TaskRecord {
        TaskRecord {
            runtime: Some(crate::RuntimeName::from_stored("python3.13")),
            image: Some("python:3.13".into()),
            command: Some("echo hi".into()),
            timeout_seconds: Some(60),
            has_zip: Some(true),
            has_stdin: Some(false),
            env: Some(BTreeMap::from([("A".into(), "1 \"quoted\"".into())])),
            network: Some(Network::None),
            collect: Some(vec!["out/*.txt".into()]),
            files: Some(r#"{"files":[],"truncated":false}"#.into()),
            created_at: Some(1),
            claimed_at: Some(2),
            started_at: Some(3),
            finished_at: Some(5),
            last_output_at: Some(4),
            worker: Some("w1".into()),
            entry: Some("1-0".into()),
            container: Some("c".into()),
            exit_code: Some(-1),
            reason: Some("exited with code -1".into()),
            reason_kind: Some(ReasonKind::Exited),
            stdout_tail: Some(b"out\xff".to_vec()),
            stderr_tail: Some(Vec::new()),
            stdout_bytes: Some(4),
            stderr_bytes: Some(0),
            owner: Some(Owner::Key("alice".into())),
            usage_cpu_ms: Some(2000),
            usage_peak_memory_bytes: Some(200 << 20),
            usage_workspace_bytes: Some(4096),
            usage_estimated: Some(true),
            cache: Some(CacheUse::None),
            egress_allow: crate::egress::AllowList::parse(&["pypi.org", "*.npmjs.org"]).ok(),
            egress_log: Some(crate::egress::EgressLog::default()),
            spec_signature: Some("0011223344556677:c2ln".into()),
            workspace_id: Some(WorkspaceId::from_bytes([7; 16])),
            workspace_base: Some(2),
            workspace_version: Some(3),
            workspace_note: Some("not saved".into()),
            edit_deletes: Some(vec!["old/".into(), "a \"b\"".into()]),
            ..TaskRecord::new(TaskState::Failed)
        }
    }

    #[test]
    fn every_field_round_trips() {
        let r = full();
        let fields = r.to_fields();
        assert_eq!(fields.len(), Field::ALL.len(), "every field is set");
        assert_eq!(TaskRecord::from_fields(fields).ok().flatten(), Some(r));
    }

    #[test]
    fn values_are_stored_in_the_forms_the_scripts_and_ops_read() {
        let r = full();
        let get = |f: Field| String::from_utf8_lossy(&r.value(f).unwrap_or_default()).into_owned();
        assert_eq!(get(Field::State), "failed");
        assert_eq!(get(Field::HasZip), "1");
        assert_eq!(get(Field::HasStdin), "0");
        assert_eq!(get(Field::Network), "none");
        assert_eq!(get(Field::Env), r#"{"A":"1 \"quoted\""}"#);
        assert_eq!(get(Field::Collect), r#"["out/*.txt"]"#);
        assert_eq!(get(Field::EditDeletes), r#"["old/","a \"b\""]"#);
        assert_eq!(get(Field::ReasonKind), "exited");
        assert_eq!(get(Field::ExitCode), "-1");
    }

    #[test]
    fn a_partial_read_leaves_the_rest_unset_and_no_state_is_no_task() {
        let fields = [Field::State, Field::Runtime, Field::ExitCode];
        let r = TaskRecord::from_values(&fields, [Some("queued"), None, None])
            .ok()
            .flatten();
        assert_eq!(r, Some(TaskRecord::new(TaskState::Queued)));
        let gone = TaskRecord::from_values(&fields, [None, Some("python3.13"), None]);
        assert!(matches!(gone, Ok(None)));
        // By name: unknown fields (a newer writer's) are skipped.
        let r = TaskRecord::from_hash([("state", "running"), ("later_field", "x")]);
        assert_eq!(r.ok().flatten().map(|r| r.state), Some(TaskState::Running));
    }

    #[test]
    fn a_malformed_value_names_its_field() {
        for (field, value) in [
            (Field::State, "done"),
            (Field::TimeoutSeconds, "-3"),
            (Field::HasZip, "yes"),
            (Field::Network, "wifi"),
            (Field::ReasonKind, "bored"),
            (Field::StartedAt, "soon"),
        ] {
            let mut pairs = vec![(Field::State, "running")];
            pairs.push((field, value));
            match TaskRecord::from_fields(pairs) {
                Err(RecordError::Malformed { field: f, value: v }) => {
                    assert_eq!((f, v.as_str()), (field, value))
                }
                other => panic!("{field}={value}: {other:?}"),
            }
        }
        let bad_json = TaskRecord::from_fields([(Field::State, "queued"), (Field::Env, "{")]);
        assert!(matches!(
            bad_json,
            Err(RecordError::BadJson {
                field: Field::Env,
                ..
            })
        ));
        let e = RecordError::required(None::<String>, Field::Image).unwrap_err();
        assert_eq!(e.to_string(), "the task record has no image field");
    }
}
