//! The task repository: every read of a task hash (`Keys::task`), for the api,
//! the worker and the ctl alike.
//!
//! Writes are not here: every write of a task is a Lua script
//! (`shared::scripts`), run with `scripts::invoke`, so that each one is atomic.
//! Reads name the fields they need, once, as a `&[Field]` (one `HMGET`), and get
//! a `TaskRecord` with just those set, or `None` when there is no such task
//! (never made, or expired). `Field::ALL` reads the whole record. The mapping
//! of stored values to types is `TaskRecord`'s; a value that does not read is a
//! `TaskReadError::Record` naming the task and the field.

use redis::aio::ConnectionLike;
use shared::spec::Inputs;
use shared::time::redis_time_ms;
use shared::{Field, Keys, RecordError, TaskRecord, TaskState};

#[derive(Debug, thiserror::Error)]
pub enum TaskReadError {
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// A stored task record does not read as its type (the error names the field).
    #[error("task {task_id}: {source}")]
    Record {
        task_id: String,
        #[source]
        source: RecordError,
    },
}

/// The values of an `HMGET` of a field list, in its order.
pub type Values = Vec<Option<Vec<u8>>>;

/// A record read together with Redis's clock at the moment of the read.
#[derive(Debug, Clone)]
pub struct Timed {
    pub record: TaskRecord,
    pub now_ms: i64,
}

/// The last entry of a task's events stream when its record was read (`0-0`
/// before the first): a waiter blocks for entries after it (`XREAD`), so
/// nothing appended between the read and the block is missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMark(String);

impl EventMark {
    /// The stream id to read after.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A task as a worker is about to run it: the record's spec signature and the
/// message it must sign, built from the very bytes read
/// (`shared::spec::message`), the task's zip and stdin, and the record read
/// from those bytes, which the caller should look at only once the signature
/// holds (a forged value may not even parse).
pub struct SpecRead {
    pub signature: Option<String>,
    pub message: Vec<u8>,
    pub record: Result<TaskRecord, TaskReadError>,
    pub zip: Option<Vec<u8>>,
    pub stdin: Option<Vec<u8>>,
}

/// `XREVRANGE <events> + - COUNT 1`: the last entry, if any (its fields unread).
type LastEvent = Vec<(String, redis::Value)>;

/// The task records under one key prefix.
#[derive(Debug, Clone)]
pub struct Tasks {
    keys: Keys,
}

impl Tasks {
    pub fn new(keys: Keys) -> Tasks {
        Tasks { keys }
    }

    /// Appends the read of task `id`'s `fields` to `pipe` (one reply, for
    /// [`Tasks::record`]): for a caller that reads a record in the same round
    /// trip as something else.
    pub fn add_read(&self, pipe: &mut redis::Pipeline, id: &str, fields: &[Field]) {
        pipe.cmd("HMGET").arg(self.keys.task(id));
        for f in fields {
            pipe.arg(f.as_str());
        }
    }

    /// The record an [`add_read`](Tasks::add_read) of `fields` replied with.
    pub fn record(
        id: &str,
        fields: &[Field],
        values: Values,
    ) -> Result<Option<TaskRecord>, TaskReadError> {
        TaskRecord::from_values(fields, values).map_err(|source| TaskReadError::Record {
            task_id: id.to_owned(),
            source,
        })
    }

    /// Task `id`'s `fields`; `None` if there is no such task.
    pub async fn read(
        &self,
        conn: &mut impl ConnectionLike,
        id: &str,
        fields: &[Field],
    ) -> Result<Option<TaskRecord>, TaskReadError> {
        let mut pipe = redis::pipe();
        self.add_read(&mut pipe, id, fields);
        let (values,): (Values,) = pipe.query_async(conn).await?;
        Tasks::record(id, fields, values)
    }

    /// Task `id`'s state; `None` if there is no such task.
    pub async fn state(
        &self,
        conn: &mut impl ConnectionLike,
        id: &str,
    ) -> Result<Option<TaskState>, TaskReadError> {
        Ok(self.read(conn, id, &[Field::State]).await?.map(|r| r.state))
    }

    /// `read`, with Redis's clock read in the same round trip (`TIME`).
    pub async fn read_at(
        &self,
        conn: &mut impl ConnectionLike,
        id: &str,
        fields: &[Field],
    ) -> Result<Option<Timed>, TaskReadError> {
        let mut pipe = redis::pipe();
        self.add_read(&mut pipe, id, fields);
        pipe.cmd("TIME");
        let (values, time): (Values, (i64, i64)) = pipe.query_async(conn).await?;
        Ok(Tasks::record(id, fields, values)?.map(|record| Timed {
            record,
            now_ms: redis_time_ms(time),
        }))
    }

    /// `read_at`, and the mark to wait from for the task's next event: the
    /// events stream's last id is read first, in the same round trip, so an
    /// event after it is always one the record read does not show yet.
    pub async fn read_marked(
        &self,
        conn: &mut impl ConnectionLike,
        id: &str,
        fields: &[Field],
    ) -> Result<Option<(Timed, EventMark)>, TaskReadError> {
        let mut pipe = redis::pipe();
        pipe.cmd("XREVRANGE")
            .arg(self.keys.task_events(id))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1);
        self.add_read(&mut pipe, id, fields);
        pipe.cmd("TIME");
        let (last, values, time): (LastEvent, Values, (i64, i64)) = pipe.query_async(conn).await?;
        let mark = EventMark(
            last.into_iter()
                .next()
                .map_or_else(|| "0-0".to_owned(), |(id, _)| id),
        );
        Ok(Tasks::record(id, fields, values)?.map(|record| {
            let timed = Timed {
                record,
                now_ms: redis_time_ms(time),
            };
            (timed, mark)
        }))
    }

    /// Task `id`'s `fields` (which should hold every signed field and
    /// `Field::SpecSignature`), its zip and its stdin, in one round trip, for
    /// the worker to verify before it acts on any of them; `None` if there is
    /// no such task.
    pub async fn read_spec(
        &self,
        conn: &mut impl ConnectionLike,
        id: &str,
        fields: &[Field],
    ) -> Result<Option<SpecRead>, TaskReadError> {
        // One transaction: a kill deleting the zip and stdin lands before or
        // after all of it, never between the record and its inputs.
        let mut pipe = redis::pipe();
        pipe.atomic();
        self.add_read(&mut pipe, id, fields);
        pipe.cmd("GET").arg(self.keys.task_zip(id));
        pipe.cmd("GET").arg(self.keys.task_stdin(id));
        let (values, zip, stdin): (Values, Option<Vec<u8>>, Option<Vec<u8>>) =
            pipe.query_async(conn).await?;
        let stored = || {
            fields
                .iter()
                .zip(&values)
                .filter_map(|(&f, v)| v.as_ref().map(|v| (f, v)))
        };
        if !stored().any(|(f, _)| f == Field::State) {
            return Ok(None);
        }
        let signature = stored()
            .find(|(f, _)| *f == Field::SpecSignature)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
        // SHA-256 of a zip of many MiB is tens of milliseconds of CPU: off the
        // runtime past `HASH_INLINE_MAX`.
        let inputs = if Inputs::size(zip.as_deref(), stdin.as_deref()) <= Inputs::HASH_INLINE_MAX {
            Inputs::hash(zip, stdin)
        } else {
            // Lost only with the runtime shutting down (or a panic): reported
            // as an I/O failure of the read, which is retried like one.
            tokio::task::spawn_blocking(move || Inputs::hash(zip, stdin))
                .await
                .map_err(|e| {
                    redis::RedisError::from(std::io::Error::other(format!(
                        "the task's zip and stdin could not be hashed: {e}"
                    )))
                })?
        };
        let message = shared::spec::message(id, stored(), &inputs);
        let record = Tasks::record(id, fields, values.clone()).and_then(|r| {
            r.ok_or_else(|| TaskReadError::Record {
                task_id: id.to_owned(),
                source: RecordError::Missing(Field::State),
            })
        });
        let (zip, stdin) = inputs.into_parts();
        Ok(Some(SpecRead {
            signature,
            message,
            record,
            zip,
            stdin,
        }))
    }

    /// The same `fields` of every task in `ids`, in one round trip, in order.
    /// Each record reads on its own, so one malformed record does not hide the
    /// others; `Ok(None)` is a task that is gone.
    pub async fn read_many<S: AsRef<str>>(
        &self,
        conn: &mut impl ConnectionLike,
        ids: &[S],
        fields: &[Field],
    ) -> Result<Vec<Result<Option<TaskRecord>, TaskReadError>>, redis::RedisError> {
        // An empty pipeline is an error in redis-rs.
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            self.add_read(&mut pipe, id.as_ref(), fields);
        }
        let replies: Vec<Values> = pipe.query_async(conn).await?;
        Ok(ids
            .iter()
            .zip(replies)
            .map(|(id, values)| Tasks::record(id.as_ref(), fields, values))
            .collect())
    }
}
