//! `script-runner-ctl`: see the library's documentation (`ctl/src/lib.rs`).

use std::io::Write as _;
use std::time::Duration;

use clap::{Parser, Subcommand};
use script_runner_ctl::read::{Reader, TaskView};
use script_runner_ctl::{Config, render, top};
use shared::tail::{DEFAULT_TAIL_BYTES, TAIL_CAP};

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
    let config = Config::from_env()?;
    let reader = Reader::new(&config)?;
    match cli.command {
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
    }
    Ok(())
}

/// Prints a task's output as it grows until it ends. Text: its stdout to
/// stdout and its stderr to stderr as they grow, the rest to stderr. JSON: the
/// record, one line each time it changes.
async fn follow_task(
    reader: &Reader,
    id: &str,
    tail_bytes: usize,
    every: Duration,
    json: bool,
) -> anyhow::Result<()> {
    let mut last: Option<TaskView> = None;
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    loop {
        let t = reader.task(id, tail_bytes).await?;
        let changed = last.as_ref().is_none_or(|p| {
            (p.state.as_str(), p.stdout_bytes, p.stderr_bytes)
                != (t.state.as_str(), t.stdout_bytes, t.stderr_bytes)
        });
        if json {
            if changed {
                writeln!(out, "{}", serde_json::to_string(&t)?)?;
            }
        } else {
            match &last {
                None => {
                    writeln!(err, "task {id}: {}", t.state)?;
                    out.write_all(t.stdout_tail.as_bytes())?;
                    err.write_all(t.stderr_tail.as_bytes())?;
                }
                Some(p) => {
                    write_growth(
                        &mut out,
                        &t.raw_stdout,
                        t.stdout_bytes - p.stdout_bytes.min(t.stdout_bytes),
                    )?;
                    write_growth(
                        &mut err,
                        &t.raw_stderr,
                        t.stderr_bytes - p.stderr_bytes.min(t.stderr_bytes),
                    )?;
                }
            }
            out.flush()?;
        }
        if t.is_terminal() {
            if !json {
                let reason = t.reason.as_deref().unwrap_or("-");
                writeln!(err, "task {id}: {} ({reason})", t.state)?;
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
