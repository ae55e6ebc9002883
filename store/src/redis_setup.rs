//! Is the Redis we were given able to lose what we store? Checked once at start by
//! the api and by every worker, together with whether it has this build's Lua
//! functions (`crate::scripts::ensure_loaded`).
//!
//! Two settings decide it. `maxmemory-policy`: anything but `noeviction` lets
//! Redis delete keys when memory runs short; `allkeys-*` may delete a queued
//! task's record or the job stream itself, and even `volatile-*` deletes keys with
//! a time to live, which every finished task's record has (its retention) and the
//! per-minute counters too. Persistence: with neither an append-only file nor an
//! RDB save point, a Redis restart loses every task, queued and running ones
//! included. Either way a client holding a `task_id` may later be told the task
//! never existed, which the contract forbids.
//!
//! The check reads `INFO` (the policy and whether AOF is on), which a restricted
//! ACL user can be allowed without seeing any configuration, and `CONFIG GET save`
//! only when AOF is off (RDB save points are not in `INFO`).

use std::time::Duration;

use backon::{ConstantBuilder, Retryable};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind};

use crate::redis_target::RedisTarget;
use shared::envvar::{Var, VarError};

/// What to do when Redis can lose data: `refuse` (the default) stops the binary
/// with the reason, `warn` logs it as an error and starts anyway.
pub const REDIS_SETUP_CHECK: Var = Var::new("REDIS_SETUP_CHECK", "refuse");

/// `REDIS_SETUP_CHECK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Refuse,
    Warn,
}

impl Mode {
    /// `REDIS_SETUP_CHECK` through `var` (`None` when unset or blank).
    pub fn from_lookup(var: &impl Fn(&str) -> Option<String>) -> Result<Mode, VarError> {
        let v = REDIS_SETUP_CHECK.get(var);
        match v.trim() {
            "refuse" => Ok(Mode::Refuse),
            "warn" => Ok(Mode::Warn),
            _ => Err(VarError::new(
                REDIS_SETUP_CHECK.name,
                &v,
                "refuse (stop when Redis can evict keys or keeps nothing on disk) or warn \
                 (log it and start anyway)",
            )),
        }
    }
}

/// The settings that decide whether Redis keeps what it is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// `maxmemory_policy` from `INFO memory`.
    pub policy: String,
    /// `maxmemory` in bytes (0: no cap).
    pub maxmemory: u64,
    /// `aof_enabled` from `INFO persistence`.
    pub aof: bool,
    /// Whether RDB save points are configured: `None` when AOF is on (not asked)
    /// or when `CONFIG GET save` was refused.
    pub save_points: Option<bool>,
}

/// How Redis can lose data, in words for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Risk {
    /// The eviction policy is not `noeviction`.
    Evicts { policy: String, maxmemory: u64 },
    /// Neither AOF nor RDB save points.
    NoPersistence,
}

impl std::fmt::Display for Risk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Risk::Evicts { policy, maxmemory } => {
                write!(
                    f,
                    "maxmemory-policy is {policy}, which deletes keys when memory runs short \
                     (task records, the job stream; volatile-* policies delete finished tasks' \
                     records before their retention ends)"
                )?;
                if *maxmemory == 0 {
                    write!(f, "; maxmemory is 0 now, so one CONFIG SET maxmemory away")?;
                }
                write!(f, ": set maxmemory-policy noeviction")
            }
            Risk::NoPersistence => f.write_str(
                "persistence is off (appendonly no and no save points), so a Redis restart \
                 loses every task: set appendonly yes",
            ),
        }
    }
}

impl Setup {
    /// What in this setup can lose data; empty when nothing can.
    pub fn risks(&self) -> Vec<Risk> {
        let mut risks = Vec::new();
        if self.policy != "noeviction" {
            risks.push(Risk::Evicts {
                policy: self.policy.clone(),
                maxmemory: self.maxmemory,
            });
        }
        if !self.aof && self.save_points == Some(false) {
            risks.push(Risk::NoPersistence);
        }
        risks
    }

    /// AOF is off and the save points could not be read: persistence unknown.
    pub fn persistence_unknown(&self) -> bool {
        !self.aof && self.save_points.is_none()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(
        "Redis can lose tasks: {}. Fix Redis, or set REDIS_SETUP_CHECK=warn to start anyway",
        join(.0)
    )]
    Unsafe(Vec<Risk>),
    /// Redis did not answer (down, unreachable, still loading): worth retrying.
    #[error("could not reach Redis to check its setup: {0}")]
    Unreachable(RedisError),
    #[error("INFO gave no {0}; is this Redis?")]
    Unexpected(&'static str),
    /// This build's Lua functions are not in Redis and could not be loaded.
    #[error(transparent)]
    Functions(#[from] crate::scripts::FunctionsError),
}

fn join(risks: &[Risk]) -> String {
    risks
        .iter()
        .map(Risk::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl SetupError {
    /// Redis did not answer: check again later.
    pub fn is_transient(&self) -> bool {
        match self {
            SetupError::Unreachable(_) => true,
            SetupError::Functions(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// Fields of an `INFO` reply (`name:value` lines; `#` headers and blanks skipped).
pub fn parse_info(info: &str) -> impl Iterator<Item = (&str, &str)> {
    info.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim_end_matches('\r').split_once(':'))
}

/// The setup as `INFO` shows it; `save_points` is left `None`.
pub fn setup_from_info(info: &str) -> Result<Setup, SetupError> {
    let field = |name: &'static str| {
        parse_info(info)
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.trim().to_owned())
            .ok_or(SetupError::Unexpected(name))
    };
    Ok(Setup {
        policy: field("maxmemory_policy")?,
        maxmemory: field("maxmemory")?.parse().unwrap_or(0),
        aof: field("aof_enabled")? == "1",
        save_points: None,
    })
}

/// Redis did not answer, as opposed to answering with a refusal.
fn unreachable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::BusyLoading | ServerErrorKind::MasterDown)
        )
}

/// One short-lived connection for a check. `Ok(None)`: a URL or a login that
/// the binary's own Redis use refuses with its own message.
async fn connect(redis: &RedisTarget) -> Result<Option<MultiplexedConnection>, SetupError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    match redis.connect(&config).await {
        Ok((c, _)) => Ok(Some(c)),
        Err(e) if unreachable(&e) => Err(SetupError::Unreachable(e)),
        // A wrong password and the like: the binary's own Redis use reports it.
        Err(e) => {
            tracing::warn!(error = %e, "cannot check Redis's setup");
            Ok(None)
        }
    }
}

/// Reads the setup over one short-lived connection. `Ok(None)`: Redis answered
/// but refused `INFO` (an ACL user without `+info`), so nothing can be said.
pub async fn inspect(redis: &RedisTarget) -> Result<Option<Setup>, SetupError> {
    let Some(mut conn) = connect(redis).await? else {
        return Ok(None);
    };
    // Two sections in one call needs Redis 7; one at a time works everywhere.
    let mut info = String::new();
    for section in ["memory", "persistence"] {
        match redis::cmd("INFO")
            .arg(section)
            .query_async::<String>(&mut conn)
            .await
        {
            Ok(text) => info.push_str(&text),
            Err(e) if unreachable(&e) => return Err(SetupError::Unreachable(e)),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot check Redis's setup: INFO was refused (allow the Redis user +info); \
                     make sure maxmemory-policy is noeviction and persistence is on"
                );
                return Ok(None);
            }
        }
    }
    let mut setup = setup_from_info(&info)?;
    if !setup.aof {
        match redis::cmd("CONFIG")
            .arg("GET")
            .arg("save")
            .query_async::<Vec<String>>(&mut conn)
            .await
        {
            Ok(pair) => setup.save_points = Some(pair.get(1).is_some_and(|v| !v.trim().is_empty())),
            Err(e) if unreachable(&e) => return Err(SetupError::Unreachable(e)),
            // Refused (ACL, or CONFIG renamed by a managed Redis): unknown.
            Err(_) => {}
        }
    }
    Ok(Some(setup))
}

/// Checks Redis once: `Err(Unsafe)` in `Mode::Refuse` when it can lose data,
/// `Err(Unreachable)` when it did not answer, `Err(Functions)` (whatever the
/// mode) when this build's Lua functions are missing and this user may not load
/// them (`crate::scripts::ensure_loaded`). Every finding is logged.
pub async fn check(redis: &RedisTarget, mode: Mode) -> Result<(), SetupError> {
    check_setup(redis, mode).await?;
    let Some(mut conn) = connect(redis).await? else {
        return Ok(());
    };
    let library = &crate::scripts::library().name;
    match crate::scripts::ensure_loaded(&mut conn).await {
        Ok(loaded) => {
            tracing::info!(%library, ?loaded, "Redis has this build's Lua functions");
            Ok(())
        }
        Err(e) => {
            if !e.is_transient() {
                tracing::error!("{e}");
            }
            Err(e.into())
        }
    }
}

/// The eviction and persistence half of [`check`].
async fn check_setup(redis: &RedisTarget, mode: Mode) -> Result<(), SetupError> {
    let Some(setup) = inspect(redis).await? else {
        return Ok(());
    };
    let risks = setup.risks();
    if risks.is_empty() {
        if setup.persistence_unknown() {
            tracing::warn!(
                "Redis has no append-only file and its RDB save points cannot be read \
                 (CONFIG GET save was refused): if it has none, a Redis restart loses every task"
            );
        } else {
            tracing::info!(
                policy = %setup.policy,
                aof = setup.aof,
                "Redis setup checked: nothing is evicted and data survives a restart"
            );
        }
        return Ok(());
    }
    let error = SetupError::Unsafe(risks);
    match mode {
        Mode::Refuse => {
            tracing::error!("{error}");
            Err(error)
        }
        Mode::Warn => {
            tracing::error!("REDIS_SETUP_CHECK=warn, starting anyway: {error}");
            Ok(())
        }
    }
}

/// `check`, again every `every` for as long as Redis does not answer; an answer
/// (safe, unsafe or refused) ends it. Cancel by dropping the future.
pub async fn check_until_answered(
    redis: &RedisTarget,
    mode: Mode,
    every: Duration,
) -> Result<(), SetupError> {
    (|| check(redis, mode))
        .retry(ConstantBuilder::new().with_delay(every).without_max_times())
        .when(SetupError::is_transient)
        .notify(|e, _| tracing::warn!(error = %e, "Redis setup not checked yet; trying again"))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Memory\r\nused_memory:1\r\nmaxmemory:0\r\nmaxmemory_human:0B\r\n\
                        maxmemory_policy:noeviction\r\n\r\n# Persistence\r\nloading:0\r\n\
                        aof_enabled:1\r\n";

    #[test]
    fn info_fields_are_read() {
        let s = setup_from_info(INFO).expect("setup");
        assert_eq!(
            s,
            Setup {
                policy: "noeviction".into(),
                maxmemory: 0,
                aof: true,
                save_points: None
            }
        );
        assert!(s.risks().is_empty());
        assert!(matches!(
            setup_from_info("# Server\r\nredis_version:7\r\n"),
            Err(SetupError::Unexpected("maxmemory_policy"))
        ));
    }

    #[test]
    fn every_policy_but_noeviction_is_a_risk() {
        let base = setup_from_info(INFO).expect("setup");
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            let s = Setup {
                policy: policy.into(),
                ..base.clone()
            };
            assert!(
                matches!(s.risks().as_slice(), [Risk::Evicts { .. }]),
                "{policy}"
            );
        }
    }

    #[test]
    fn no_aof_and_no_save_points_is_a_risk_and_unknown_is_not() {
        let base = setup_from_info(INFO).expect("setup");
        let off = |save_points| Setup {
            aof: false,
            save_points,
            ..base.clone()
        };
        assert_eq!(off(Some(false)).risks(), [Risk::NoPersistence]);
        assert!(off(Some(true)).risks().is_empty());
        assert!(off(None).risks().is_empty() && off(None).persistence_unknown());
        let msg = SetupError::Unsafe(off(Some(false)).risks()).to_string();
        assert!(
            msg.contains("appendonly yes") && msg.contains("REDIS_SETUP_CHECK=warn"),
            "{msg}"
        );
    }

    #[test]
    fn the_mode_is_refuse_or_warn() {
        let set = |v: &'static str| move |_: &str| Some(v.to_owned());
        assert_eq!(Mode::from_lookup(&|_: &str| None), Ok(Mode::Refuse));
        assert_eq!(Mode::from_lookup(&set("warn")), Ok(Mode::Warn));
        let e = Mode::from_lookup(&set("off")).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.starts_with("REDIS_SETUP_CHECK=\"off\"")));
    }
}
