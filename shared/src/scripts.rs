//! Lua scripts for every state change, so each one is atomic inside Redis.
//!
//! Each script documents its KEYS / ARGV and what it returns. They read the clock
//! with `TIME` (Redis 7 replicates script effects, so this is allowed) so that all
//! timestamps come from one clock. Field names here must be `Field::as_str()`
//! values; `tests::scripts_only_name_known_fields` keeps them honest.
//!
//! Rules every script follows: a terminal state is never overwritten, and a worker
//! only writes to a task whose `worker` field is its own name.

/// Unix time in milliseconds from Redis's clock, as a Lua local `now`.
macro_rules! now_ms {
    () => {
        "local t = redis.call('TIME')\nlocal now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))\n"
    };
}

/// Returned by a script when the task belongs to another worker: the caller must
/// not run (or must stop) it.
pub const NOT_OWNER: &str = "not-owner";

/// A worker takes a task it read from the stream.
///
/// KEYS[1] task hash. ARGV[1] worker name, ARGV[2] the stream entry it read.
/// Returns `"running"` when this call moved it from queued, or when the same
/// worker claimed it from the same entry before (a retry whose first reply was
/// lost); `"not-owner"` when anyone else (or another entry) already runs it;
/// otherwise the current state (e.g. `"killed"` if `kill_task` came first), or
/// `"missing"`.
pub const CLAIM: &str = concat!(
    now_ms!(),
    r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if st == 'running' then
  if redis.call('HGET', KEYS[1], 'worker') == ARGV[1] and redis.call('HGET', KEYS[1], 'entry') == ARGV[2] then
    return 'running'
  end
  return 'not-owner'
end
if st ~= 'queued' then return st end
redis.call('HSET', KEYS[1], 'state', 'running', 'worker', ARGV[1], 'entry', ARGV[2], 'claimed_at', now)
return 'running'
"#
);

/// The task's container has started.
///
/// KEYS[1] task hash. ARGV[1] worker name, ARGV[2] container id.
/// Returns `"running"` if the task is still this worker's and running, else
/// `"not-owner"` or the current state: the caller must then stop the container
/// it just started.
pub const STARTED: &str = concat!(
    now_ms!(),
    r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then return 'not-owner' end
if st ~= 'running' then return st end
redis.call('HSET', KEYS[1], 'started_at', now, 'container', ARGV[2])
return 'running'
"#
);

/// Publishes the output tails of a running task.
///
/// KEYS[1] task hash. ARGV[1] worker name, ARGV[2] stdout tail, ARGV[3] stderr
/// tail, ARGV[4] stdout bytes, ARGV[5] stderr bytes, ARGV[6] milliseconds since
/// the last output byte ("" when there was none yet).
/// Returns the current state, so the worker learns of a `kill_task` on every tick,
/// or `"not-owner"` (nothing written) if the task is no longer this worker's.
pub const PROGRESS: &str = concat!(
    now_ms!(),
    r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then return 'not-owner' end
redis.call('HSET', KEYS[1], 'stdout_tail', ARGV[2], 'stderr_tail', ARGV[3],
  'stdout_bytes', ARGV[4], 'stderr_bytes', ARGV[5])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'last_output_at', string.format('%d', tonumber(now) - tonumber(ARGV[6])))
end
return st
"#
);

/// A worker records how its task ended.
///
/// KEYS[1] task hash, KEYS[2] task zip, KEYS[3] stats hash. ARGV[1] worker
/// name, ARGV[2] terminal state, ARGV[3] reason kind, ARGV[4] reason, ARGV[5]
/// exit code ("" for none), ARGV[6] retention seconds for the record.
/// Returns the state the task ends in: ARGV[2], or the terminal state it already
/// had (a kill that came first wins, and is never overwritten).
pub const FINISH: &str = concat!(
    now_ms!(),
    r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then return st end
if st == 'queued' or st == 'running' then
  redis.call('HSET', KEYS[1], 'state', ARGV[2], 'reason_kind', ARGV[3], 'reason', ARGV[4],
    'finished_at', now)
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'exit_code', ARGV[5]) end
  redis.call('HINCRBY', KEYS[3], 'finished:' .. ARGV[2] .. ':' .. ARGV[3], 1)
  st = ARGV[2]
end
redis.call('HDEL', KEYS[1], 'container')
redis.call('DEL', KEYS[2])
redis.call('EXPIRE', KEYS[1], ARGV[6])
return st
"#
);

/// `kill_task`: a queued or running task becomes `killed`, at once and for good.
/// The worker holding a running one sees the state on its next tick and stops the
/// container; a queued one is skipped when a worker reads it.
///
/// KEYS[1] task hash, KEYS[2] task zip, KEYS[3] stats hash. ARGV[1] reason,
/// ARGV[2] reason kind, ARGV[3] retention seconds.
/// Returns `{state, killed}`: the state after the call and 1 if this call killed it.
/// `{"missing", 0}` when there is no such task.
pub const KILL: &str = concat!(
    now_ms!(),
    r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return {'missing', 0} end
if st ~= 'queued' and st ~= 'running' then return {st, 0} end
redis.call('HSET', KEYS[1], 'state', 'killed', 'reason', ARGV[1], 'reason_kind', ARGV[2],
  'finished_at', now)
-- The zip is only read before the container starts: whoever holds the task
-- needs it no more, and a worker lost before FINISH must not leak it.
redis.call('DEL', KEYS[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('HINCRBY', KEYS[3], 'finished:killed:' .. ARGV[2], 1)
return {'killed', 1}
"#
);

/// Forgets a dead worker, atomically, only if it is still dead and holds no job:
/// deleting a consumer drops its pending entries, so the check and the delete
/// must not be separated.
///
/// KEYS[1] jobs stream, KEYS[2] the worker's heartbeat key, KEYS[3] the workers
/// set. ARGV[1] group, ARGV[2] worker name.
/// Returns 1 if it was forgotten, 0 if it is alive or still holds jobs.
pub const FORGET_WORKER: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
redis.call('SREM', KEYS[3], ARGV[2])
return 1
"#;

/// Puts a job back at the end of the stream for any worker to take, and drops
/// the old entry, in one step (so it is never both or neither). An entry that
/// was already acknowledged (settled twice) is not put back again.
///
/// KEYS[1] jobs stream. ARGV[1] group, ARGV[2] old entry id, ARGV[3] task id.
/// Returns 1 if requeued, 0 if the entry was no longer pending.
pub const REQUEUE: &str = r#"
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('XADD', KEYS[1], '*', 'task_id', ARGV[3])
return 1
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Field;

    const ALL_FIELDS: [Field; 21] = [
        Field::State,
        Field::Runtime,
        Field::Image,
        Field::Command,
        Field::TimeoutSeconds,
        Field::HasZip,
        Field::CreatedAt,
        Field::ClaimedAt,
        Field::Entry,
        Field::StartedAt,
        Field::FinishedAt,
        Field::LastOutputAt,
        Field::Worker,
        Field::Container,
        Field::ExitCode,
        Field::Reason,
        Field::ReasonKind,
        Field::StdoutTail,
        Field::StderrTail,
        Field::StdoutBytes,
        Field::StderrBytes,
    ];

    /// Every single-quoted word after a hash command must be a known field or a
    /// state name, so a typo in a script cannot silently write a stray field.
    #[test]
    fn scripts_only_name_known_fields() {
        let known: Vec<&str> = ALL_FIELDS
            .iter()
            .map(|f| f.as_str())
            .chain(crate::TaskState::ALL.iter().map(|s| s.as_str()))
            .chain([
                "",
                "missing",
                NOT_OWNER,
                "TIME",
                "HGET",
                "HSET",
                "HDEL",
                "DEL",
                "EXPIRE",
                "%d",
                "HINCRBY",
                "finished:",
                "finished:killed:",
                ":",
            ])
            .collect();
        for script in [CLAIM, STARTED, PROGRESS, FINISH, KILL] {
            for (i, part) in script.split('\'').enumerate() {
                if i % 2 == 1 {
                    assert!(
                        known.contains(&part),
                        "unknown quoted name {part:?} in a script"
                    );
                }
            }
        }
    }

    #[test]
    fn requeue_writes_the_job_field_the_worker_reads() {
        assert!(REQUEUE.contains(&format!("'{}'", crate::keys::JOB_TASK_ID)));
    }
}
