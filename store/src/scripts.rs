//! Runs the Lua scripts of `shared::scripts` as Redis Functions: this build's
//! library (`shared::functions::LIBRARY`, named by a hash of its text) is
//! loaded once into Redis with `FUNCTION LOAD`, and every call is an `FCALL` of
//! `<library>_<script>`. Which KEYS and ARGV a script gets is decided by its
//! typed call (`shared::scripts::ScriptCall`), never here.
//!
//! Who loads: Redis's admin (`script-runner-ctl redis load-functions`, which the
//! Compose deployment runs before the api and the worker start). The api and
//! the worker check at start that their version is there ([`ensure_loaded`]),
//! loading it themselves only where their user may (a dev Redis with no ACL);
//! otherwise they stop with [`FunctionsError::NotPermitted`], which says what to
//! run. A Redis that lost its functions while they run (`FUNCTION FLUSH`) is
//! handled the same way by [`invoke`]: loaded again where permitted, otherwise
//! the call fails with that error.

use redis::aio::ConnectionLike;
use redis::{ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind, Value};
use shared::functions::{LIBRARY, Library};
use shared::scripts::{
    KeyCreated, KillReply, Script, ScriptCall, SubmitRaw, SubmitReply, TaskStateReply, WsReply,
};

/// This build's library.
pub fn library() -> &'static Library {
    &LIBRARY
}

/// Why this build's library is not in Redis and could not be put there.
#[derive(Debug, thiserror::Error)]
pub enum FunctionsError {
    #[error(
        "Redis does not have this build's Lua functions (library {library}) and this Redis \
         user may not load them ({source}). Load them as Redis's admin user, then start again: \
         REDIS_URL=redis://admin:<password>@<host>:<port> script-runner-ctl redis load-functions \
         (docs/operations.md, \"Upgrading\")"
    )]
    NotPermitted {
        library: String,
        #[source]
        source: RedisError,
    },
    #[error("FUNCTION LOAD of library {library} failed: {source}")]
    Load {
        library: String,
        #[source]
        source: RedisError,
    },
    #[error("could not ask Redis for its functions: {0}")]
    Redis(#[from] RedisError),
}

impl FunctionsError {
    /// Redis did not answer (as opposed to refusing): worth asking again.
    pub fn is_transient(&self) -> bool {
        match self {
            FunctionsError::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.kind() == ErrorKind::Server(ServerErrorKind::BusyLoading)
            }
            _ => false,
        }
    }
}

/// What [`load`] or [`ensure_loaded`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    /// Redis had this version already.
    Already,
    /// Loaded now.
    Now,
}

/// The `library_name` of every entry of a `FUNCTION LIST` reply (RESP2 arrays
/// of name/value pairs, or RESP3 maps).
fn library_names(reply: Value) -> Vec<String> {
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for entry in entries {
        let pairs: Vec<(Value, Value)> = match entry {
            Value::Map(pairs) => pairs,
            Value::Array(flat) => {
                let mut it = flat.into_iter();
                std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
            }
            _ => continue,
        };
        for (k, v) in pairs {
            if String::from_redis_value(k).is_ok_and(|k| k == "library_name")
                && let Ok(name) = String::from_redis_value(v)
            {
                names.push(name);
            }
        }
    }
    names
}

/// The names of the libraries in Redis that are ours, this version or not
/// (`FUNCTION LIST LIBRARYNAME sr_*`), sorted.
pub async fn our_libraries(conn: &mut impl ConnectionLike) -> RedisResult<Vec<String>> {
    let reply: Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(format!("{}*", shared::functions::PREFIX))
        .query_async(conn)
        .await?;
    let mut names: Vec<String> = library_names(reply)
        .into_iter()
        .filter(|n| Library::is_ours(n))
        .collect();
    names.sort();
    Ok(names)
}

/// Whether Redis has this build's library (`FUNCTION LIST LIBRARYNAME <name>`).
pub async fn is_loaded(conn: &mut impl ConnectionLike) -> RedisResult<bool> {
    let name = &library().name;
    let reply: Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(name)
        .query_async(conn)
        .await?;
    Ok(library_names(reply).iter().any(|n| n == name))
}

/// `FUNCTION LOAD` of this build's library; a version already there (loaded by
/// someone else meanwhile) is left as it is.
pub async fn load(conn: &mut impl ConnectionLike) -> Result<Loaded, FunctionsError> {
    let lib = library();
    let result: RedisResult<String> = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&lib.text)
        .query_async(conn)
        .await;
    match result {
        Ok(_) => Ok(Loaded::Now),
        Err(e) if e.detail().is_some_and(|d| d.contains("already exists")) => Ok(Loaded::Already),
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) => {
            Err(FunctionsError::NotPermitted {
                library: lib.name.clone(),
                source: e,
            })
        }
        Err(e) if FunctionsError::Redis(e.clone()).is_transient() => Err(FunctionsError::Redis(e)),
        Err(e) => Err(FunctionsError::Load {
            library: lib.name.clone(),
            source: e,
        }),
    }
}

/// Makes sure Redis has this build's library: asks first (so a user that may
/// not load code never tries), loads it if missing.
pub async fn ensure_loaded(conn: &mut impl ConnectionLike) -> Result<Loaded, FunctionsError> {
    if is_loaded(conn).await? {
        return Ok(Loaded::Already);
    }
    load(conn).await
}

/// Redis's answer to an `FCALL` of a function it does not have.
fn function_missing(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// A script call that failed: Redis's error, or a reply this version cannot
/// read (a newer or older script than this build's: not worth retrying).
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error(transparent)]
    Redis(#[from] RedisError),
    #[error("the {script} script replied {reply}, which this version does not know")]
    Reply { script: &'static str, reply: String },
}

impl InvokeError {
    /// Redis's error code (`NOPERM`, ...), if Redis refused the call.
    pub fn code(&self) -> Option<&str> {
        match self {
            InvokeError::Redis(e) => e.code(),
            InvokeError::Reply { .. } => None,
        }
    }
}

/// How a script's reply is read: each `ScriptCall<R>` builder names its `R`,
/// and [`invoke`] reads the reply as that. `Err` carries what came back, shown.
pub trait Reply: Sized {
    fn read(reply: Value) -> Result<Self, String>;
}

/// `reply` as a plain redis-rs type, or what it was.
fn plain<T: FromRedisValue>(reply: Value) -> Result<T, String> {
    let shown = format!("{reply:?}");
    T::from_redis_value(reply).map_err(|_| shown)
}

impl Reply for TaskStateReply {
    fn read(reply: Value) -> Result<Self, String> {
        let s: String = plain(reply)?;
        TaskStateReply::parse(&s).map_err(|e| format!("{:?}", e.name))
    }
}

impl Reply for KillReply {
    fn read(reply: Value) -> Result<Self, String> {
        KillReply::parse(plain(reply)?).map_err(|e| format!("{:?}", e.name))
    }
}

impl Reply for KeyCreated {
    fn read(reply: Value) -> Result<Self, String> {
        KeyCreated::parse(plain(reply)?).map_err(|e| e.name)
    }
}

/// The scripts that reply 1 (done) or 0 (not).
impl Reply for bool {
    fn read(reply: Value) -> Result<Self, String> {
        match plain::<i64>(reply)? {
            1 => Ok(true),
            0 => Ok(false),
            n => Err(n.to_string()),
        }
    }
}

/// SUBMIT's reply: an entry id, the backlog (an integer) or
/// `{quota, limit, count, frees_at}`.
impl Reply for SubmitReply {
    fn read(reply: Value) -> Result<Self, String> {
        let raw = match reply {
            Value::Int(backlog) => SubmitRaw::Backlog(backlog),
            Value::Array(parts) if parts.len() == 3 => {
                let (tag, why, detail): (String, String, String) = plain(Value::Array(parts))?;
                if tag != "workspace" {
                    return Err(format!("{tag:?}"));
                }
                SubmitRaw::Workspace(why, detail)
            }
            Value::Array(parts) => {
                let (quota, limit, count, frees): (String, i64, i64, i64) =
                    plain(Value::Array(parts))?;
                SubmitRaw::Quota(quota, limit, count, frees)
            }
            Value::BulkString(_) | Value::SimpleString(_) => SubmitRaw::Entry,
            other => return Err(format!("{other:?}")),
        };
        SubmitReply::parse(raw).map_err(|e| format!("{:?}", e.name))
    }
}

/// The workspace scripts' reply: a number, or `{'refused', why, detail?}`.
impl Reply for WsReply {
    fn read(reply: Value) -> Result<Self, String> {
        let raw = match reply {
            Value::Int(n) => Ok(n),
            Value::Array(mut parts) if parts.len() >= 2 => {
                let detail = if parts.len() > 2 {
                    plain::<String>(parts.remove(2))?
                } else {
                    String::new()
                };
                let why: String = plain(parts.remove(1))?;
                Err((why, detail))
            }
            other => return Err(format!("{other:?}")),
        };
        WsReply::parse(raw).map_err(|e| format!("{:?}", e.name))
    }
}

fn read_reply<R: Reply>(script: Script, reply: Value) -> Result<R, InvokeError> {
    R::read(reply).map_err(|reply| InvokeError::Reply {
        script: script.name(),
        reply,
    })
}

/// Runs `calls` in order on `conn`, sent as one pipeline (so on one
/// connection, to one node, one round trip), and reads each reply as its
/// call says. If Redis lost the library, they are sent again one by one
/// through [`invoke`], which loads it where this user may.
pub async fn invoke_all<R: Reply>(
    conn: &mut impl ConnectionLike,
    calls: &[&ScriptCall<R>],
) -> Result<Vec<R>, InvokeError> {
    let mut pipe = redis::pipe();
    for call in calls {
        pipe.add_command(fcall(call));
    }
    let replies: Vec<Value> = match pipe.query_async(conn).await {
        Err(e) if function_missing(&e) => {
            let mut replies = Vec::with_capacity(calls.len());
            for call in calls {
                replies.push(invoke(conn, call).await?);
            }
            return Ok(replies);
        }
        other => other?,
    };
    calls
        .iter()
        .zip(replies)
        .map(|(call, reply)| read_reply(call.script(), reply))
        .collect()
}

/// `call` as an `FCALL` of this build's library.
fn fcall<R>(call: &ScriptCall<R>) -> redis::Cmd {
    let mut fcall = redis::cmd("FCALL");
    fcall
        .arg(library().function(call.script()))
        .arg(call.keys().len())
        .arg(call.keys());
    for a in call.args() {
        fcall.arg(a.as_slice());
    }
    fcall
}

/// Runs `call` on `conn` and reads its reply as the call's `R`. If Redis lost
/// the library, it is loaded again where this user may (then the call is sent
/// again, once); otherwise the error is [`FunctionsError::NotPermitted`]'s.
pub async fn invoke<R: Reply>(
    conn: &mut impl ConnectionLike,
    call: &ScriptCall<R>,
) -> Result<R, InvokeError> {
    let reply = invoke_value(conn, call).await?;
    read_reply(call.script(), reply)
}

/// `invoke`, the reply left as Redis sent it.
async fn invoke_value<R>(
    conn: &mut impl ConnectionLike,
    call: &ScriptCall<R>,
) -> RedisResult<Value> {
    let fcall = fcall(call);
    match fcall.query_async(conn).await {
        Err(e) if function_missing(&e) => {}
        other => return other,
    }
    match load(conn).await {
        Ok(loaded) => {
            tracing::warn!(
                library = %library().name,
                ?loaded,
                "Redis had lost this build's Lua functions; loaded them again"
            );
            fcall.query_async(conn).await
        }
        Err(FunctionsError::Redis(e)) => Err(e),
        Err(e) => {
            let kind = match &e {
                FunctionsError::NotPermitted { .. } => ErrorKind::Server(ServerErrorKind::NoPerm),
                _ => ErrorKind::Server(ServerErrorKind::ResponseError),
            };
            Err(RedisError::from((
                kind,
                "Redis lost its Lua functions",
                e.to_string(),
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_are_read_from_resp2_and_resp3_lists() {
        let s = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let resp2 = Value::Array(vec![Value::Array(vec![
            s("library_name"),
            s("sr_0011aabb"),
            s("engine"),
            s("LUA"),
        ])]);
        assert_eq!(library_names(resp2), ["sr_0011aabb"]);
        let resp3 = Value::Array(vec![Value::Map(vec![
            (s("library_name"), s("sr_0011aabb")),
            (s("engine"), s("LUA")),
        ])]);
        assert_eq!(library_names(resp3), ["sr_0011aabb"]);
        assert!(library_names(Value::Nil).is_empty());
    }
}
