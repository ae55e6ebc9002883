//! The Redis ACL users of the deployment (deploy/redis/entrypoint.sh) may send
//! every command their binary sends. Redis checks the commands a Lua script
//! calls against the ACL of the client running it, so a script that starts
//! using a command its user lacks fails in production only (the tests run as
//! Redis's default user). This test holds the lists to the code:
//!
//! - every `redis.call('X', ...)` of every script in shared/src/lua is allowed
//!   to each user that runs the script: scripts built with `ScriptCall::name`
//!   in api/src run as `api`, in worker/src as `worker`; those built only in
//!   store/src are assigned below, and a script nobody runs fails the test;
//! - every `cmd("X")` the api or worker sends from Rust (their sources and the
//!   store modules they call), and the typed redis-rs calls listed in
//!   `TYPED`, are allowed to that user.
//!
//! The ctl's writes (`keys`, `tasks kill`, `cache clear`, `redis`) run as
//! `admin`, who may send anything, and its reads as a `+@read` user
//! (`e2e/tests/ops/` runs them so): neither has a list to hold here.
//!
//! What this cannot see (a typed call not in `TYPED`) the deploy test catches
//! at run time: ACL LOG must be empty after a normal run there.
//!
//! And against a real redis-server with the entrypoint's `api` and `worker`
//! users: neither may load or delete code (SCRIPT, EVAL, EVALSHA, FUNCTION
//! LOAD/DELETE/FLUSH/RESTORE) nor reach past its prefix, both may call their
//! functions; an api or a worker whose functions are missing stops at start
//! saying what to run; a library flushed while running is reloaded where permitted, and named
//! as missing where not.
//!
//! Self-contained on purpose (no `mod common`): files, redis-server, the api
//! and ctl binaries, the worker in-process.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ENTRYPOINT: &str = "deploy/redis/entrypoint.sh";

/// Scripts built only in store/src, and the users that run them there:
/// `key_touch` by the api's key lookup; the key management ones by
/// script-runner-ctl as `admin` (who may send anything).
const VIA_STORE: &[(&str, &[&str])] = &[
    ("key_touch", &["api"]),
    ("key_create", &[]),
    ("key_rotate", &[]),
    ("key_revoke", &[]),
];

/// Where each user's Rust-side commands are sent from.
const SOURCES: &[(&str, &[&str])] = &[
    (
        "api",
        &[
            "api/src",
            "store/src/tasks.rs",
            "store/src/workspaces.rs",
            "store/src/usage.rs",
            "store/src/jobs.rs",
            "store/src/apikeys.rs",
            "store/src/scripts.rs",
            "store/src/redis_pool.rs",
        ],
    ),
    (
        "worker",
        &[
            "worker/src",
            // Not store/src/tasks.rs: the worker reads a record with `read` and
            // `state` only (HMGET, as in worker/src), never the api's waits'
            // XREVRANGE, which its user may not send.
            "store/src/jobs.rs",
            // The workspace reads: a version a task starts from, and the
            // sweep's walk over every kept version.
            "store/src/workspaces.rs",
            "store/src/scripts.rs",
            "store/src/redis_pool.rs",
        ],
    ),
];

/// Commands the api and worker send only where their user may, and whose
/// refusal they report (`FunctionsError::NotPermitted`): loading this build's
/// functions when Redis lacks them (dev, tests). A deployment loads them as
/// `admin` first, so its users never send it.
const ONLY_WHERE_PERMITTED: &[(&str, &str)] = &[("function", "load")];

/// redis-rs typed calls and the command (or `command|subcommand`) each sends.
const TYPED: &[(&str, &str)] = &[
    ("xlen", "xlen"),
    ("hgetall", "hgetall"),
    ("smembers", "smembers"),
    ("mget", "mget"),
    ("zrem", "zrem"),
    ("xgroup_create_mkstream", "xgroup|create"),
    ("xread_options", "xreadgroup"),
    ("xack", "xack"),
    ("xdel", "xdel"),
    ("hget", "hget"),
    ("ttl", "ttl"),
    ("set_ex", "setex"),
    ("sadd", "sadd"),
    ("srem", "srem"),
    ("atomic", "multi"),
];

/// Commands named with a subcommand in ACL rules (`+xgroup|create`).
const CONTAINERS: &[&str] = &[
    "xgroup", "script", "client", "config", "object", "xinfo", "function",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rust_files(rel: &str, out: &mut Vec<PathBuf>) {
    let path = repo_root().join(rel);
    if path.is_file() {
        out.push(path);
        return;
    }
    for entry in std::fs::read_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        let p = entry.expect("dir entry").path();
        if p.is_dir() {
            rust_files(
                p.strip_prefix(repo_root())
                    .expect("under root")
                    .to_str()
                    .expect("utf-8"),
                out,
            );
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The quoted string literals that follow each `marker` in `text`: for
/// `redis.call(` the command and its next argument, for `cmd(` the command and
/// its first `.arg(`.
/// `strict`: every `marker` must be followed by a literal.
fn calls(text: &str, marker: &str, strict: bool) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices(marker) {
        let rest = &text[at + marker.len()..];
        let mut lits = Vec::new();
        let mut s = rest.trim_start();
        for _ in 0..2 {
            let Some(q) = s.chars().next().filter(|c| *c == '\'' || *c == '"') else {
                break;
            };
            let Some(end) = s[1..].find(q) else { break };
            lits.push(s[1..1 + end].to_ascii_lowercase());
            s = s[end + 2..].trim_start();
            // `redis.call('X', 'Y')`, or Rust's `cmd("X").arg("Y")` (rustfmt
            // may break the line before `.arg`).
            let next = s.strip_prefix(',').or_else(|| {
                s.strip_prefix(')')
                    .map(str::trim_start)
                    .and_then(|r| r.strip_prefix(".arg("))
            });
            match next {
                Some(r) => s = r.trim_start(),
                None => break,
            }
        }
        if lits.is_empty() && !strict {
            continue;
        }
        assert!(
            !lits.is_empty(),
            "`{marker}` not followed by a literal command name: {}",
            &rest[..rest.len().min(60)]
        );
        let cmd = lits[0].clone();
        let sub = lits.get(1).cloned();
        out.push((cmd, sub));
    }
    out
}

/// The commands each user may send, from the entrypoint's `NAME="..."` lists.
fn acl_lists() -> BTreeMap<String, BTreeSet<String>> {
    let text = read(&repo_root().join(ENTRYPOINT));
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines() {
        let Some((name, value)) = line.split_once("=\"") else {
            continue;
        };
        // The command lists, and the lists they are made of.
        if !["conn", "lua", "api_cmds", "worker_cmds"].contains(&name) {
            continue;
        }
        let value = value.trim_end_matches('"');
        let mut expanded = Vec::new();
        for word in value.split_whitespace() {
            match word.strip_prefix('$') {
                Some(var) => expanded.push(
                    vars.get(var)
                        .unwrap_or_else(|| panic!("{ENTRYPOINT}: ${var} used before it is set"))
                        .clone(),
                ),
                None => expanded.push(word.to_owned()),
            }
        }
        vars.insert(name.to_owned(), expanded.join(" "));
    }
    let mut users = BTreeMap::new();
    for user in ["api", "worker"] {
        let list = vars
            .get(&format!("{user}_cmds"))
            .unwrap_or_else(|| panic!("{ENTRYPOINT} sets no {user}_cmds"));
        let cmds = list
            .split_whitespace()
            .map(|w| {
                assert!(
                    w.starts_with('+'),
                    "{ENTRYPOINT}: {user}_cmds has {w}, not a +command"
                );
                w[1..].to_ascii_lowercase()
            })
            .collect();
        users.insert(user.to_owned(), cmds);
    }
    users
}

fn allowed(list: &BTreeSet<String>, cmd: &str, sub: Option<&str>) -> bool {
    if list.contains(cmd) {
        return true;
    }
    match sub {
        Some(sub) if CONTAINERS.contains(&cmd) => list.contains(&format!("{cmd}|{sub}")),
        _ => false,
    }
}

#[test]
fn every_script_command_is_allowed_to_the_users_running_the_script() {
    let lists = acl_lists();
    let lua_dir = repo_root().join("shared/src/lua");
    let mut scripts: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for entry in std::fs::read_dir(&lua_dir).expect("shared/src/lua") {
        let p = entry.expect("dir entry").path();
        if p.extension().is_some_and(|e| e == "lua") {
            let name = p
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("utf-8")
                .to_owned();
            scripts.insert(name, BTreeSet::new());
        }
    }
    assert!(
        scripts.contains_key("finish"),
        "no scripts found in {}",
        lua_dir.display()
    );
    // Who builds each script's call.
    for (user, dir) in [("api", "api/src"), ("worker", "worker/src")] {
        let mut files = Vec::new();
        rust_files(dir, &mut files);
        for f in files {
            let text = read(&f);
            for (at, _) in text.match_indices("ScriptCall::") {
                let name: String = text[at + "ScriptCall::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if let Some(users) = scripts.get_mut(&name) {
                    users.insert(user);
                }
            }
        }
    }
    let mut assigned: BTreeSet<&str> = BTreeSet::new();
    for (name, users) in VIA_STORE {
        let runners = scripts
            .get_mut(*name)
            .unwrap_or_else(|| panic!("VIA_STORE names {name}, which has no script"));
        runners.extend(users.iter().copied());
        assigned.insert(name);
    }
    let mut problems = Vec::new();
    for (name, users) in &scripts {
        if users.is_empty() && !assigned.contains(name.as_str()) {
            problems.push(format!(
                "shared/src/lua/{name}.lua: no ScriptCall::{name} in api/src or worker/src; \
                 say in VIA_STORE which users run it"
            ));
        }
        let text = read(&lua_dir.join(format!("{name}.lua")));
        assert!(
            !text.contains("redis.pcall("),
            "{name}.lua: pcall is not checked here"
        );
        let cmds = calls(&text, "redis.call(", true);
        assert!(!cmds.is_empty(), "{name}.lua calls no command?");
        for user in users {
            for (cmd, sub) in &cmds {
                if !allowed(&lists[*user], cmd, sub.as_deref()) {
                    problems.push(format!(
                        "{name}.lua calls {} but {ENTRYPOINT} does not allow it to `{user}`, \
                         which runs the script",
                        cmd.to_uppercase()
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_command_sent_from_rust_is_allowed_to_its_user() {
    let lists = acl_lists();
    let mut problems = BTreeSet::new();
    for (user, sources) in SOURCES {
        let mut files = Vec::new();
        for s in *sources {
            rust_files(s, &mut files);
        }
        for f in files {
            let text = read(&f);
            let rel = f
                .strip_prefix(repo_root())
                .unwrap_or(&f)
                .display()
                .to_string();
            let mut sent: Vec<(String, Option<String>)> = calls(&text, "cmd(", false);
            for (method, cmd) in TYPED {
                if text.contains(&format!(".{method}(")) {
                    let (c, s) = match cmd.split_once('|') {
                        Some((c, s)) => (c.to_owned(), Some(s.to_owned())),
                        None => (cmd.to_string(), None),
                    };
                    sent.push((c, s));
                }
            }
            for (cmd, sub) in sent {
                // A redis-rs `pipe().atomic()` sends MULTI and EXEC.
                let needed: Vec<&str> = if cmd == "multi" {
                    vec!["multi", "exec"]
                } else {
                    vec![cmd.as_str()]
                };
                for c in needed {
                    let on_purpose = ONLY_WHERE_PERMITTED
                        .iter()
                        .any(|(pc, ps)| c == *pc && sub.as_deref() == Some(*ps));
                    if !on_purpose && !allowed(&lists[*user], c, sub.as_deref()) {
                        problems.insert(format!(
                            "{rel} sends {} but {ENTRYPOINT} does not allow it to `{user}`",
                            c.to_uppercase()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "\n{}",
        problems.into_iter().collect::<Vec<_>>().join("\n")
    );
}

// ---- The same users on a real redis-server ----------------------------------

/// The rule words of `user`'s line in the entrypoint's ACL file
/// (`user api on #<hash> resetkeys ~${prefix}:* ... $api_cmds`), with `prefix`,
/// the expanded command list and a plain password in place of the hash.
fn acl_rules(user: &str, prefix: &str, password: &str) -> Vec<String> {
    let text = read(&repo_root().join(ENTRYPOINT));
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("user {user} on ")))
        .unwrap_or_else(|| panic!("{ENTRYPOINT} has no `user {user} on ...` line"));
    let lists = acl_lists();
    // `$(worker_rules)`: the words its function echoes (the one definition the
    // local worker and every worker host's user share).
    let worker_rules = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("worker_rules() { echo \""))
        .and_then(|l| l.split('"').next())
        .unwrap_or_else(|| panic!("{ENTRYPOINT} has no worker_rules() {{ echo \"...\"; }}"));
    // `$worker_keys`: the key patterns its line sets.
    let worker_keys = text
        .lines()
        .find_map(|l| l.strip_prefix("worker_keys=\""))
        .map(|l| l.trim_end_matches('"'))
        .unwrap_or_else(|| panic!("{ENTRYPOINT} sets no worker_keys=\"...\""));
    let words = line.split_whitespace().skip(2).flat_map(|w| {
        if w == "$(worker_rules)" {
            worker_rules
                .split_whitespace()
                .flat_map(|w| match w {
                    "$worker_keys" => worker_keys.split_whitespace().collect::<Vec<_>>(),
                    _ => vec![w],
                })
                .collect::<Vec<_>>()
        } else {
            vec![w]
        }
    });
    let mut rules = Vec::new();
    for word in words {
        if word.starts_with("#$(hash") || word.starts_with("\"$REDIS_") {
            if word.starts_with("#") {
                rules.push(format!(">{password}"));
            }
            continue;
        }
        if let Some(list) = word.strip_prefix('$').and_then(|w| w.strip_suffix("_cmds")) {
            rules.extend(lists[list].iter().map(|c| format!("+{c}")));
            continue;
        }
        assert!(
            !word.contains("$("),
            "{ENTRYPOINT}: cannot read {word:?} of user {user}"
        );
        rules.push(word.replace("${prefix}", prefix));
    }
    rules
}

/// Creates `user` in `redis` as the entrypoint does; its URL. A command this
/// redis-server does not know (`CLIENT SETINFO` before Redis 7.2) is left out.
async fn entrypoint_user(redis: &testkit::Redis, user: &str, prefix: &str) -> String {
    entrypoint_user_named(redis, user, user, prefix).await
}

/// Creates a user `name` with the rules of the entrypoint's `user` line (a
/// worker host's user, `worker-<host>`, has `worker`'s rules); its URL.
pub(crate) async fn entrypoint_user_named(
    redis: &testkit::Redis,
    user: &str,
    name: &str,
    prefix: &str,
) -> String {
    let password = format!("{name}-test-password");
    let mut admin = redis.conn().await;
    let mut rules = Vec::new();
    for rule in acl_rules(user, prefix, &password) {
        if let Some(cmd) = rule.strip_prefix('+') {
            let info: Vec<redis::Value> = redis::cmd("COMMAND")
                .arg("INFO")
                .arg(cmd)
                .query_async(&mut admin)
                .await
                .expect("COMMAND INFO");
            if matches!(info.as_slice(), [redis::Value::Nil]) {
                eprintln!("this redis-server has no {cmd}: left out of {user}'s rules");
                continue;
            }
        }
        rules.push(rule);
    }
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg(rules)
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER with the entrypoint's rules");
    format!("redis://{name}:{password}@127.0.0.1:{}", redis.port)
}

async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("log in")
}

/// Loads this build's functions as Redis's unrestricted user (the admin).
async fn load_as_admin(redis: &testkit::Redis) {
    let mut admin = redis.conn().await;
    store::scripts::ensure_loaded(&mut admin)
        .await
        .expect("FUNCTION LOAD as admin");
}

fn ctl_bin() -> PathBuf {
    testkit::binary("script-runner-ctl", "SCRIPT_RUNNER_CTL_BIN")
}

#[tokio::test]
async fn the_api_and_worker_users_may_not_load_code_nor_reach_past_their_prefix() {
    use shared::scripts::ScriptCall;
    let redis = testkit::Redis::start().await;
    let prefix = testkit::unique_prefix('a');
    let keys = shared::Keys::new(&prefix);
    load_as_admin(&redis).await;
    let library = store::scripts::library();
    // A script in the cache, so EVALSHA is refused for its ACL, not NOSCRIPT.
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut redis.conn().await)
        .await
        .expect("SCRIPT LOAD as admin");
    let evil = "#!lua name=evil\nredis.register_function('evil', function() return 1 end)";
    for user in ["api", "worker"] {
        let mut c = connect(&entrypoint_user(&redis, user, &prefix).await).await;
        let refused: Vec<Vec<String>> = [
            &["SCRIPT", "LOAD", "return 1"][..],
            &["SCRIPT", "FLUSH"],
            &["EVAL", "return 1", "0"],
            &["EVALSHA", &sha, "0"],
            &["EVAL_RO", "return 1", "0"],
            &["FUNCTION", "LOAD", evil],
            &["FUNCTION", "LOAD", "REPLACE", evil],
            &["FUNCTION", "DELETE", &library.name],
            &["FUNCTION", "FLUSH"],
            &["FUNCTION", "RESTORE", "x"],
            &["FUNCTION", "DUMP"],
            &["FLUSHALL"],
            &["FLUSHDB"],
            &["CONFIG", "GET", "save"],
            &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
            &["KEYS", "*"],
            &["ACL", "SETUSER", user, "+@all"],
            &["MODULE", "LIST"],
            &["HGET", "elsewhere:task:x", "state"],
            &["HGET", &format!("{prefix}x:task:x"), "state"],
        ]
        .iter()
        .map(|a| a.iter().map(|s| s.to_string()).collect())
        .collect();
        for args in refused {
            let r: redis::RedisResult<redis::Value> = redis::cmd(&args[0])
                .arg(&args[1..])
                .query_async(&mut c)
                .await;
            let e = r.expect_err(&format!("{user} may send {args:?}"));
            assert_eq!(e.code(), Some("NOPERM"), "{user} {args:?}: {e}");
        }
        // Its own calls work: the version check, and a function of its own.
        assert!(
            store::scripts::is_loaded(&mut c)
                .await
                .expect("FUNCTION LIST")
        );
        // A function of its own, on its keys and on keys outside its prefix.
        let elsewhere = shared::Keys::new("elsewhere");
        let (own, foreign) = match user {
            "api" => (
                store::scripts::invoke(&mut c, &ScriptCall::key_touch(&keys, "0", 60_000))
                    .await
                    .map(|_| ()),
                store::scripts::invoke(&mut c, &ScriptCall::key_touch(&elsewhere, "0", 60_000))
                    .await
                    .map(|_| ()),
            ),
            _ => (
                store::scripts::invoke(&mut c, &ScriptCall::claim(&keys, "t1", "w1", "0-1"))
                    .await
                    .map(|_| ()),
                store::scripts::invoke(&mut c, &ScriptCall::claim(&elsewhere, "t1", "w1", "0-1"))
                    .await
                    .map(|_| ()),
            ),
        };
        own.unwrap_or_else(|e| panic!("{user}: FCALL of its own function: {e}"));
        if user == "worker" {
            // A worker host's password reaches no API key and no index of the
            // api's, directly or through a function it may call.
            let apikey = keys.api_key(&"0".repeat(64));
            for args in [
                vec!["HGETALL".to_owned(), keys.api_key_names()],
                vec!["HGETALL".to_owned(), apikey.clone()],
                vec!["HSET".to_owned(), apikey, "name".into(), "mine".into()],
                vec!["SMEMBERS".to_owned(), keys.api_keys_revoked()],
                vec![
                    "ZRANGE".to_owned(),
                    keys.task_index(),
                    "0".into(),
                    "-1".into(),
                ],
                vec![
                    "ZADD".to_owned(),
                    keys.workspaces(),
                    "1".into(),
                    "planted".into(),
                ],
            ] {
                let r: redis::RedisResult<redis::Value> = redis::cmd(&args[0])
                    .arg(&args[1..])
                    .query_async(&mut c)
                    .await;
                let e = r.expect_err(&format!("worker may send {args:?}"));
                assert_eq!(e.code(), Some("NOPERM"), "worker {args:?}: {e}");
            }
            // It reads the index of every workspace, which the blob sweep walks.
            let (cursor, _): (u64, Vec<String>) = redis::cmd("ZSCAN")
                .arg(keys.workspaces())
                .arg(0)
                .query_async(&mut c)
                .await
                .expect("the worker reads the workspace index");
            assert_eq!(cursor, 0);
            let record = shared::apikey::ApiKeyRecord {
                name: "mine".into(),
                scopes: Default::default(),
                limits: Default::default(),
                allow_hosts: None,
                created_at: None,
                last_used_at: None,
            };
            let mint = ScriptCall::key_create(&keys, "mine", &"1".repeat(64), &record.to_fields());
            let e = store::scripts::invoke(&mut c, &mint)
                .await
                .expect_err("the worker minted an API key");
            assert_eq!(e.code(), Some("NOPERM"), "worker: {e}");
        }
        let e = foreign.expect_err("a function on keys outside the prefix");
        assert_eq!(e.code(), Some("NOPERM"), "{user}: {e}");
    }
    // Nothing above changed the library.
    let mut admin = redis.conn().await;
    let libraries = store::scripts::our_libraries(&mut admin)
        .await
        .expect("list");
    assert_eq!(libraries, std::slice::from_ref(&library.name));
}

#[tokio::test]
async fn an_api_without_its_functions_stops_at_start_saying_what_to_run_as_admin() {
    let redis = testkit::Redis::start().await;
    let prefix = testkit::unique_prefix('a');
    let url = entrypoint_user(&redis, "api", &prefix).await;
    let mut api = testkit::process::ApiProcess::spawn(&url, &[("REDIS_KEY_PREFIX", &prefix)]);
    let status = api.exit_status(std::time::Duration::from_secs(30)).await;
    assert!(!status.success(), "{}", api.log());
    let log = api.log();
    let library = &store::scripts::library().name;
    assert!(
        log.contains(&format!("library {library}"))
            && log.contains("script-runner-ctl redis load-functions"),
        "{log}"
    );
    // The admin loads them with the ctl, and the same api starts.
    let out = tokio::process::Command::new(ctl_bin())
        .env_clear()
        .env("REDIS_URL", redis.url())
        .args(["redis", "load-functions"])
        .output()
        .await
        .expect("script-runner-ctl");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), library);
    let api = testkit::process::ApiProcess::start(&url, &[("REDIS_KEY_PREFIX", &prefix)]).await;
    assert!(
        api.log().contains("Redis has this build's Lua functions"),
        "{}",
        api.log()
    );
}

#[tokio::test]
async fn functions_flushed_while_running_are_reloaded_where_permitted_and_named_where_not() {
    use shared::scripts::ScriptCall;
    let redis = testkit::Redis::start().await;
    let prefix = testkit::unique_prefix('a');
    let keys = shared::Keys::new(&prefix);
    let touch = ScriptCall::key_touch(&keys, "0", 60_000);
    let flush = || async {
        let () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut redis.conn().await)
            .await
            .expect("FUNCTION FLUSH");
    };
    // As a user that may load code (dev): loaded again, the call answers.
    let mut unrestricted = redis.conn().await;
    let _touched = store::scripts::invoke(&mut unrestricted, &touch)
        .await
        .expect("first call");
    flush().await;
    let _touched = store::scripts::invoke(&mut unrestricted, &touch)
        .await
        .expect("the call after FUNCTION FLUSH");
    assert!(
        store::scripts::is_loaded(&mut unrestricted)
            .await
            .expect("list")
    );
    // As the deployment's api user: the call fails, naming what to run.
    flush().await;
    let mut api = connect(&entrypoint_user(&redis, "api", &prefix).await).await;
    let e = store::scripts::invoke(&mut api, &touch)
        .await
        .expect_err("the api user cannot load the functions");
    assert!(
        e.to_string()
            .contains("script-runner-ctl redis load-functions"),
        "{e}"
    );
    assert!(!store::scripts::is_loaded(&mut api).await.expect("list"));
    load_as_admin(&redis).await;
    let _touched = store::scripts::invoke(&mut api, &touch)
        .await
        .expect("the call once the admin loaded them");
}

#[tokio::test]
async fn a_worker_without_its_functions_stops_at_start_saying_what_to_run_as_admin() {
    let redis = testkit::Redis::start().await;
    let prefix = testkit::unique_prefix('a');
    let url = entrypoint_user(&redis, "worker", &prefix).await;
    let tasks_dir = std::env::temp_dir().join(format!("sr-tasks-{prefix}"));
    let mut env = testkit::service_env(&redis, &prefix, 60);
    for (k, v) in [
        ("REDIS_URL", url.as_str()),
        ("WORKER_NAME", &format!("fn-{prefix}")),
        ("TASKS_DIR", &tasks_dir.display().to_string()),
        // It stops before taking a job: no host rules needed for that.
        ("TASK_FIREWALL", "off"),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    let cfg = script_runner_worker::Config::from_lookup(|k| env.get(k).cloned()).expect("config");
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        script_runner_worker::run(cfg, std::future::pending()),
    )
    .await
    .expect("the worker stops at start, not later");
    let _ = std::fs::remove_dir_all(&tasks_dir);
    let e = result.expect_err("a worker whose functions are missing must not start");
    let library = &store::scripts::library().name;
    assert!(
        e.to_string().contains(&format!("library {library}"))
            && e.to_string()
                .contains("script-runner-ctl redis load-functions"),
        "{e}"
    );
}
