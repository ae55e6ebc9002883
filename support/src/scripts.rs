//! The Lua scripts of `shared::scripts`, each wrapped in a `redis::Script` once
//! per process: the SHA1 is computed once, and every call is an `EVALSHA` (with
//! one `EVAL` fallback after Redis lost its script cache).

use std::sync::LazyLock;

use deadpool_redis::redis::Script;
use shared::scripts as lua;

macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            pub static $name: LazyLock<Script> = LazyLock::new(|| Script::new(lua::$name));
        )*
    };
}

scripts! {
    /// See `shared/src/lua/submit.lua`.
    SUBMIT,
    /// See `shared/src/lua/claim.lua`.
    CLAIM,
    /// See `shared/src/lua/started.lua`.
    STARTED,
    /// See `shared/src/lua/progress.lua`.
    PROGRESS,
    /// See `shared/src/lua/finish.lua`.
    FINISH,
    /// See `shared/src/lua/kill.lua`.
    KILL,
    /// See `shared/src/lua/forget_worker.lua`.
    FORGET_WORKER,
    /// See `shared/src/lua/requeue.lua`.
    REQUEUE,
}
