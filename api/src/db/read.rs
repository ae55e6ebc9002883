//! Reads of one task: its status (with Redis's clock, and the mark to wait
//! from) and its collected files.

use deadpool_redis::redis::AsyncCommands;
use shared::{Field, Owner, TaskState};
use store::tasks::EventMark;

use super::{Store, StoreError};

/// The fields of a task hash that `get` reads: what `get_task_status` shows.
pub use shared::view::STATUS_FIELDS;

/// A task record as `get` read it (its `STATUS_FIELDS`), with Redis's clock at
/// the moment of the read.
pub type StatusRead = store::tasks::Timed;

/// A task's state, its collected files' listing (JSON) and their zip (read
/// only once the task has ended).
pub type TaskFiles = (TaskState, Option<String>, Option<Vec<u8>>);

impl Store {
    /// A task's state, its collected files' listing (JSON) and, once it has
    /// ended, their zip; `None` if there is no such task or `sees` refuses its
    /// owner. The owner is read first and the zip only for a caller who sees
    /// the task, so another owner's task costs what an unknown id does.
    pub async fn files(
        &self,
        id: &str,
        sees: impl FnOnce(Option<&Owner>) -> bool,
    ) -> Result<Option<TaskFiles>, StoreError> {
        let mut conn = self.pool.get().await?;
        const FIELDS: [Field; 3] = [Field::State, Field::Files, Field::Owner];
        let record = self.tasks.read(&mut conn, id, &FIELDS).await?;
        let Some(r) = record.filter(|r| sees(r.owner.as_ref())) else {
            return Ok(None);
        };
        let zip = if r.state.is_terminal() {
            conn.get(self.keys.task_files(id)).await?
        } else {
            None
        };
        Ok(Some((r.state, r.files, zip)))
    }

    /// Task `id`'s collected files' listing (JSON), once it has ended; `None`
    /// before, or with nothing collected. For a caller that has already
    /// checked the owner (`resources/list` reads the owner's own index).
    pub async fn collected(&self, id: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.pool.get().await?;
        const FIELDS: [Field; 2] = [Field::State, Field::Files];
        let record = self.tasks.read(&mut conn, id, &FIELDS).await?;
        Ok(record
            .filter(|r| r.state.is_terminal())
            .and_then(|r| r.files))
    }

    /// Whether a worker ever took task `id` (CLAIM wrote its name); false for
    /// a task that is not there.
    pub async fn claimed(&self, id: &str) -> Result<bool, StoreError> {
        let mut conn = self.pool.get().await?;
        const FIELDS: [Field; 2] = [Field::State, Field::Worker];
        let record = self.tasks.read(&mut conn, id, &FIELDS).await?;
        Ok(record.is_some_and(|r| r.worker.is_some()))
    }

    /// The task hash's `STATUS_FIELDS` with Redis's clock, or `None` if there
    /// is no such task (or it expired).
    pub async fn get(&self, id: &str) -> Result<Option<StatusRead>, StoreError> {
        let mut conn = self.pool.get().await?;
        Ok(self.tasks.read_at(&mut conn, id, &STATUS_FIELDS).await?)
    }

    /// `get`, and the mark to wait from (`wait_for_event`); see
    /// `Tasks::read_marked`.
    pub async fn get_marked(
        &self,
        id: &str,
    ) -> Result<Option<(StatusRead, EventMark)>, StoreError> {
        let mut conn = self.pool.get().await?;
        Ok(self
            .tasks
            .read_marked(&mut conn, id, &STATUS_FIELDS)
            .await?)
    }
}
