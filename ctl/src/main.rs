//! `script-runner-ctl`: see the library's documentation (`ctl/src/lib.rs`).

use std::io::Write as _;
use std::time::Duration;

use clap::{Parser, Subcommand};
use script_runner_ctl::functions::FunctionsAdmin;
use script_runner_ctl::keys::{IssuedKey, KeyAdmin, render_list};
use script_runner_ctl::read::{Reader, TaskView};
use script_runner_ctl::tasks::{Killed, MAX_TASKS, TaskAdmin};
use script_runner_ctl::workspaces::WorkspaceAdmin;
use script_runner_ctl::{Config, cache, render, signing, top, usage, workspaces};
use shared::Owner;
use shared::apikey::{Limits, Scopes};
use shared::options::Networks;
use shared::tail::{DEFAULT_TAIL_BYTES, TAIL_CAP};
use shared::task::OperatorKill;

/// A live view of a script-runner deployment, read from Redis only.
///
/// Reads REDIS_URL and REDIS_KEY_PREFIX like the api and the workers.
#[derive(Parser)]
#[command(name = "script-runner-ctl", version)]
struct Cli {
    /// Print JSON instead of text (`top` and `task --follow`: one JSON object per line).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Workers, queue, running tasks and tasks finished in the last hour.
    Status,
    /// The same, refreshing live; the stuck-looking tasks first. q quits.
    Top {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// One task's record and output tails.
    Task {
        /// The task id (as `run_script` returned it).
        id: String,
        /// Watch the output grow until the task ends: its stdout on stdout, its
        /// stderr on stderr.
        #[arg(long, short)]
        follow: bool,
        /// Bytes of each tail to show (at most 65536).
        #[arg(long, default_value_t = DEFAULT_TAIL_BYTES)]
        tail_bytes: usize,
        /// Seconds between reads with --follow.
        #[arg(long, default_value_t = 0.5)]
        interval: f64,
    },
    /// API keys: create, list, revoke, rotate.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Tasks in bulk (as Redis's admin user): kill an owner's.
    #[command(subcommand)]
    Tasks(TasksCommand),
    /// What each owner's tasks (API key, or OAuth subject) used in all: tasks,
    /// CPU seconds, highest peak memory, /workspace bytes; the heaviest first.
    Usage {
        /// How many owners to list (at most 1000); the rest are summed as "(others)".
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// This build's Lua functions in Redis (as Redis's admin user).
    #[command(subcommand)]
    Redis(RedisCommand),
    /// The workers' dependency caches (pip, npm) kept per owner.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Persistent workspaces, every owner's: list, show, delete.
    #[command(subcommand)]
    Workspaces(WorkspacesCommand),
    /// The key pair task specs are signed with (api) and verified by (workers).
    /// Needs no Redis.
    #[command(subcommand)]
    SigningKey(SigningKeyCommand),
}

#[derive(Subcommand)]
enum SigningKeyCommand {
    /// A new key pair: TASK_SIGNING_KEY for the api, TASK_VERIFY_KEYS for the workers.
    Generate,
    /// The public key (TASK_VERIFY_KEYS) of the TASK_SIGNING_KEY read from stdin.
    Public,
}

#[derive(Subcommand)]
enum WorkspacesCommand {
    /// The most recently used workspaces: id, owner, head, bytes, last use, busy task.
    List {
        /// Only this owner's: an API key's name or oauth:<subject>.
        #[arg(long)]
        owner: Option<String>,
        /// How many to list (at most 1000).
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One workspace and its kept versions (each with the task that made it).
    Show { id: String },
    /// Delete a workspace and its versions, whoever owns it (as Redis's admin
    /// user). A task running on it keeps running; its files are not saved.
    Delete { id: String },
}

#[derive(Subcommand)]
enum TasksCommand {
    /// Kill every queued or running task of one owner, as kill_task does.
    /// Exactly one of --owner, --admin.
    #[command(group(clap::ArgGroup::new("whose").required(true).args(["owner", "admin"])))]
    Kill {
        /// The owner: an API key's name or oauth:<subject>.
        #[arg(long)]
        owner: Option<String>,
        /// The admin key's tasks (those with no owner).
        #[arg(long)]
        admin: bool,
    },
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Have every worker empty an owner's caches (or all) before their next
    /// use. Exactly one of --owner, --admin, --all.
    #[command(group(clap::ArgGroup::new("whose").required(true).args(["owner", "admin", "all"])))]
    Clear {
        /// The owner: an API key's name or oauth:<subject>.
        #[arg(long)]
        owner: Option<String>,
        /// The caches of the admin key's tasks.
        #[arg(long)]
        admin: bool,
        /// Every owner's caches.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand)]
enum RedisCommand {
    /// Load this build's Lua functions library unless Redis has it; print its name.
    /// Run it before starting an api or worker of a new version.
    LoadFunctions,
    /// Our libraries in Redis, one per version loaded; this build's is marked.
    Functions,
    /// Delete every library of ours but this build's and those named with --keep:
    /// run it once no api or worker of an older version runs.
    PruneFunctions {
        /// A library to keep (an older version still running), e.g. sr_1a2b3c4d.
        #[arg(long)]
        keep: Vec<String>,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key and print it, once (Redis keeps only its SHA-256).
    Create {
        /// Its name: the owner of its tasks; [a-z0-9][a-z0-9._-]{0,62}.
        #[arg(long)]
        name: String,
        /// What it may do: run, read, kill, comma-separated.
        #[arg(long, default_value = "run,read,kill")]
        scopes: String,
        /// At most this many of its tasks waiting in the queue.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        max_queued: Option<u64>,
        /// At most this many of its tasks queued or running at once (more are refused).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        max_running: Option<u64>,
        /// At most this many CPU seconds used by its tasks in any 24 hours.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        cpu_seconds_per_day: Option<u64>,
        /// The egress policies its tasks may ask for: internet, none, allow,
        /// comma-separated (default: all three).
        #[arg(long)]
        networks: Option<String>,
        /// The most its allow-list tasks may name: host names and *.domains,
        /// comma-separated; every entry a task asks for must be one of those
        /// hosts or under one of those domains (default: any). Give it with
        /// --networks none,allow to keep its tasks to those hosts.
        #[arg(long)]
        allow_hosts: Option<String>,
    },
    /// Every key: name, scopes, limits, created, last used (never the key).
    List,
    /// Delete a key: refused by every api replica from its next request on.
    Revoke {
        name: String,
        /// Then kill its queued and running tasks too (they keep running
        /// otherwise).
        #[arg(long)]
        kill_tasks: bool,
    },
    /// A new key for the same name, scopes, limits and tasks; the old key is
    /// refused at once.
    Rotate { name: String },
}

fn signing_key(cmd: SigningKeyCommand, json: bool) -> anyhow::Result<()> {
    let generated = matches!(cmd, SigningKeyCommand::Generate);
    let signer = match cmd {
        SigningKeyCommand::Generate => signing::generate()?,
        SigningKeyCommand::Public => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            signing::from_line(&line)?
        }
    };
    match (json, generated) {
        (true, _) => {
            let mut out = serde_json::json!({
                "key_id": signer.key_id().to_string(),
                "verify_key": signer.public_base64(),
            });
            if generated {
                out["signing_key"] = signer.seed_base64().into();
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        (false, true) => print!("{}", signing::render_pair(&signer)),
        (false, false) => println!("TASK_VERIFY_KEYS={}", signer.public_base64()),
    }
    Ok(())
}

/// "1 task", "3 tasks".
fn tasks_phrase(n: usize) -> String {
    if n == 1 {
        "1 task".to_owned()
    } else {
        format!("{n} tasks")
    }
}

fn whose_tasks(owner: &Owner) -> String {
    match owner {
        Owner::Admin => "the admin key".to_owned(),
        _ => format!("{:?}", owner.as_stored()),
    }
}

fn warn_truncated(killed: &Killed) {
    if killed.truncated {
        eprintln!(
            "warning: more than {MAX_TASKS} tasks to look at; only those were: run it again \
             for the rest"
        );
    }
}

fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s.clamp(0.1, 3600.0))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("script-runner-ctl: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::SigningKey(cmd) = cli.command {
        return signing_key(cmd, cli.json);
    }
    let config = Config::from_env()?;
    if let Command::Keys(cmd) = cli.command {
        return keys(&config, cmd, cli.json).await;
    }
    if let Command::Redis(cmd) = cli.command {
        return redis_functions(&config, cmd, cli.json).await;
    }
    if let Command::Workspaces(cmd) = cli.command {
        return workspaces_cmd(&config, cmd, cli.json).await;
    }
    if let Command::Tasks(TasksCommand::Kill { owner, admin }) = cli.command {
        let owner = match (owner, admin) {
            (Some(name), _) => Owner::parse(&name)?,
            (None, _) => Owner::Admin,
        };
        let killed = TaskAdmin::new(&config)
            .await?
            .kill_all_of(&owner, OperatorKill::Owner)
            .await?;
        if cli.json {
            let out = serde_json::json!({
                "owner": (!owner.is_admin()).then(|| owner.as_stored()),
                "admin": owner.is_admin(),
                "killed": killed.task_ids.len(),
                "task_ids": killed.task_ids,
                "truncated": killed.truncated,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            println!(
                "killed {} of {}",
                tasks_phrase(killed.task_ids.len()),
                whose_tasks(&owner)
            );
            warn_truncated(&killed);
        }
        return Ok(());
    }
    if let Command::Cache(CacheCommand::Clear { owner, admin, all }) = cli.command {
        let whose = match (owner, admin, all) {
            (Some(name), ..) => cache::Whose::owner(&name)?,
            (None, true, _) => cache::Whose::Admin,
            _ => cache::Whose::All,
        };
        let cache::Cleared { generation, known } = cache::clear(&config, &whose).await?;
        if cli.json {
            let (owner, admin, all) = match &whose {
                cache::Whose::Owner(owner) => (Some(owner.to_string()), false, false),
                cache::Whose::Admin => (None, true, false),
                cache::Whose::All => (None, false, true),
            };
            let out = serde_json::json!({
                "owner": owner, "admin": admin, "all": all, "generation": generation,
                "owner_has_tasks": known
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            let whose = match &whose {
                cache::Whose::Owner(owner) => format!("{:?}'s dependency cache", owner.to_string()),
                cache::Whose::Admin => "the admin key's dependency cache".to_owned(),
                cache::Whose::All => "every owner's dependency cache".to_owned(),
            };
            eprintln!(
                "asked every worker to clear {whose} (generation {generation}); \
                 each does before it next lends it"
            );
            if known == Some(false) {
                eprintln!(
                    "warning: no task of this owner has finished here with its usage recorded: \
                     is the name right? (an OAuth owner is oauth:<subject>)"
                );
            }
        }
        return Ok(());
    }
    let reader = Reader::new(&config).await?;
    match cli.command {
        Command::Keys(_)
        | Command::Redis(_)
        | Command::Cache(_)
        | Command::Workspaces(_)
        | Command::SigningKey(_)
        | Command::Tasks(_) => {}
        Command::Status => {
            let s = reader.status().await?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", render::status(&s));
            }
        }
        Command::Top { interval } if cli.json => loop {
            let s = reader.status().await?;
            println!("{}", serde_json::to_string(&s)?);
            tokio::time::sleep(seconds(interval)).await;
        },
        Command::Top { interval } => {
            top::run(&reader, seconds(interval), config.keys.prefix()).await?
        }
        Command::Task {
            id,
            follow,
            tail_bytes,
            interval,
        } => {
            let tail_bytes = tail_bytes.min(TAIL_CAP);
            if follow {
                follow_task(&reader, &id, tail_bytes, seconds(interval), cli.json).await?;
            } else {
                let t = reader.task(&id, tail_bytes).await?;
                if cli.json {
                    println!("{}", serde_json::to_string_pretty(&t)?);
                } else {
                    print!("{}", render::task(&t));
                }
            }
        }
        Command::Usage { limit } => {
            let r = reader.usage(limit).await?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", usage::render(&r));
            }
        }
    }
    Ok(())
}

async fn workspaces_cmd(config: &Config, cmd: WorkspacesCommand, json: bool) -> anyhow::Result<()> {
    let admin = WorkspaceAdmin::new(config).await?;
    let parse = |id: &str| shared::workspace::WorkspaceId::parse(id.trim());
    match cmd {
        WorkspacesCommand::List { owner, limit } => {
            let owner = owner.as_deref().map(Owner::parse).transpose()?;
            let rows = admin.list(owner.as_ref(), limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", workspaces::render_list(&rows));
            }
        }
        WorkspacesCommand::Show { id } => {
            let detail = admin.show(&parse(&id)?).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&detail)?);
            } else {
                print!("{}", workspaces::render_detail(&detail));
            }
        }
        WorkspacesCommand::Delete { id } => {
            let id = parse(&id)?;
            let owner = admin.delete(&id).await?;
            if json {
                let out = serde_json::json!({"workspace_id": id, "owner": owner.to_string(), "deleted": true});
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                eprintln!("deleted workspace {id} of {owner} and its versions");
            }
        }
    }
    Ok(())
}

async fn redis_functions(config: &Config, cmd: RedisCommand, json: bool) -> anyhow::Result<()> {
    let admin = FunctionsAdmin::new(config).await?;
    let name = &store::scripts::library().name;
    match cmd {
        RedisCommand::LoadFunctions => {
            let loaded = admin.load().await?;
            if json {
                let loaded_now = loaded == store::scripts::Loaded::Now;
                let out = serde_json::json!({"library": name, "loaded_now": loaded_now});
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                match loaded {
                    store::scripts::Loaded::Now => eprintln!("loaded library {name}"),
                    store::scripts::Loaded::Already => {
                        eprintln!("library {name} was loaded already")
                    }
                }
                println!("{name}");
            }
        }
        RedisCommand::Functions => {
            let list = admin.list().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                for l in &list {
                    let mark = if l.this_build { "  (this build)" } else { "" };
                    println!("{}{mark}", l.name);
                }
                if !list.iter().any(|l| l.this_build) {
                    eprintln!("this build's library {name} is not loaded");
                }
            }
        }
        RedisCommand::PruneFunctions { keep } => {
            let deleted = admin.prune(&keep).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&deleted)?);
            } else {
                for d in &deleted {
                    println!("deleted {d}");
                }
                eprintln!("{} deleted; kept {name} (this build)", deleted.len());
            }
        }
    }
    Ok(())
}

async fn keys(config: &Config, cmd: KeysCommand, json: bool) -> anyhow::Result<()> {
    let admin = KeyAdmin::new(config).await?;
    let issued = |name: &str, key: &str, scopes: Scopes, what: &str| -> anyhow::Result<()> {
        if json {
            let out = IssuedKey {
                name,
                key,
                scopes: scopes.iter().map(|s| s.as_str()).collect(),
            };
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            eprintln!("{what} key {name:?} (scopes {scopes}); it is shown only this once:");
            println!("{key}");
        }
        Ok(())
    };
    match cmd {
        KeysCommand::Create {
            name,
            scopes,
            max_queued,
            max_running,
            cpu_seconds_per_day,
            networks,
            allow_hosts,
        } => {
            let scopes = Scopes::parse(&scopes)?;
            let networks = networks
                .as_deref()
                .map(Networks::parse)
                .transpose()
                .map_err(|e| {
                    anyhow::anyhow!(
                        "--networks: {e}; use internet, none and allow, comma-separated"
                    )
                })?;
            let limits = Limits {
                max_queued,
                max_running,
                cpu_seconds_per_day,
                networks,
            };
            let allow_hosts = allow_hosts
                .as_deref()
                .map(|hosts| {
                    let entries: Vec<&str> = hosts.split(',').collect();
                    shared::egress::AllowList::parse(&entries)
                })
                .transpose()
                .map_err(|e| anyhow::anyhow!("--allow-hosts: {e}"))?;
            if allow_hosts.is_some() && limits.allows_network(shared::options::Network::Internet) {
                eprintln!(
                    "warning: --allow-hosts holds only its allow-list tasks: this key may still \
                     ask for network \"internet\"; add --networks none,allow to keep it to those hosts"
                );
            }
            let key = admin.create(&name, scopes, limits, allow_hosts).await?;
            issued(&name, key.expose(), scopes, "created")?;
        }
        KeysCommand::List => {
            let list = admin.list().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print!("{}", render_list(&list));
            }
        }
        KeysCommand::Revoke { name, kill_tasks } => {
            admin.revoke(&name).await?;
            // Revoked first, so the key submits nothing more meanwhile.
            let killed = if kill_tasks {
                let owner = Owner::Key(name.clone());
                let tasks = TaskAdmin::new(config).await?;
                Some(tasks.kill_all_of(&owner, OperatorKill::KeyRevoked).await?)
            } else {
                None
            };
            match (json, &killed) {
                (true, None) => {
                    println!("{}", serde_json::json!({ "name": name, "revoked": true }))
                }
                (true, Some(k)) => println!(
                    "{}",
                    serde_json::json!({
                        "name": name, "revoked": true, "killed": k.task_ids.len(),
                        "task_ids": k.task_ids, "truncated": k.truncated
                    })
                ),
                (false, None) => println!("revoked key {name:?}"),
                (false, Some(k)) => {
                    println!(
                        "revoked key {name:?} and killed {} of its tasks",
                        k.task_ids.len()
                    );
                    warn_truncated(k);
                }
            }
        }
        KeysCommand::Rotate { name } => {
            let (key, scopes) = admin.rotate(&name).await?;
            issued(&name, key.expose(), scopes, "rotated")?;
        }
    }
    Ok(())
}

/// Prints a task's output as it grows until it ends. Text: its stdout to
/// stdout and its stderr to stderr as they grow, the rest to stderr. JSON: the
/// record, one line each time it changes. A read that fails because Redis is
/// down or failing over is said on stderr (once per outage) and tried again at
/// the next interval: a follower rides out a failover, as `top` does.
async fn follow_task(
    reader: &Reader,
    id: &str,
    tail_bytes: usize,
    every: Duration,
    json: bool,
) -> anyhow::Result<()> {
    let mut last: Option<TaskView> = None;
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let mut outage = false;
    let mut shown: (u64, u64) = (0, 0);
    loop {
        let t = match reader.task(id, tail_bytes).await {
            Ok(t) => t,
            Err(e) if e.is_transient() => {
                if !outage {
                    writeln!(err, "cannot read Redis ({e}); trying again")?;
                    outage = true;
                }
                tokio::time::sleep(every).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        outage = false;
        let changed = last.as_ref().is_none_or(|p| {
            (
                p.status.state.as_str(),
                p.status.stdout_bytes,
                p.status.stderr_bytes,
            ) != (
                t.status.state.as_str(),
                t.status.stdout_bytes,
                t.status.stderr_bytes,
            )
        });
        if json {
            if changed {
                writeln!(out, "{}", serde_json::to_string(&t)?)?;
            }
        } else {
            match &last {
                None => {
                    writeln!(err, "task {id}: {}", t.status.state)?;
                    out.write_all(t.status.stdout_tail.as_bytes())?;
                    err.write_all(t.status.stderr_tail.as_bytes())?;
                }
                Some(_) => {
                    write_growth(
                        &mut out,
                        &t.raw_stdout,
                        t.status.stdout_bytes.saturating_sub(shown.0),
                    )?;
                    write_growth(
                        &mut err,
                        &t.raw_stderr,
                        t.status.stderr_bytes.saturating_sub(shown.1),
                    )?;
                }
            }
            // The most ever shown: a read from a primary just demoted may show
            // output the new one does not have yet (the worker writes the
            // same bytes there again), and counting from the smaller figure
            // would print them twice.
            shown = (
                shown.0.max(t.status.stdout_bytes),
                shown.1.max(t.status.stderr_bytes),
            );
            out.flush()?;
        }
        if t.is_terminal() {
            if !json {
                let reason = t.status.reason.as_deref().unwrap_or("-");
                writeln!(err, "task {id}: {} ({reason})", t.status.state)?;
            }
            return Ok(());
        }
        last = Some(t);
        tokio::time::sleep(every).await;
    }
}

/// Writes the last `grew` bytes of `kept` (the stored tail), saying so when
/// more arrived than the tail still holds.
fn write_growth(w: &mut impl std::io::Write, kept: &[u8], grew: u64) -> std::io::Result<()> {
    if grew == 0 {
        return Ok(());
    }
    let n = (grew as usize).min(kept.len());
    if (n as u64) < grew {
        writeln!(std::io::stderr(), "[{} bytes not shown]", grew - n as u64)?;
    }
    w.write_all(&kept[kept.len() - n..])
}
