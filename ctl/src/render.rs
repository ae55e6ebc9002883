//! Plain-text views of what `read` returns.

use std::fmt::Write as _;

use crate::read::{Status, TaskView, WorkerView};

/// Seconds as a short duration: `42s`, `3m05s`, `2h01m`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_else(|| "-".into())
}

pub fn slots(w: &WorkerView) -> String {
    match (w.slots_busy, w.slots_total) {
        (Some(b), Some(t)) => format!("{b}/{t}"),
        (Some(b), None) => format!("{b}/?"),
        _ => "-".into(),
    }
}

pub fn last_beat(w: &WorkerView) -> String {
    match (w.alive, w.last_heartbeat_seconds_ago) {
        (false, _) => "missing".into(),
        (true, Some(s)) => format!("{} ago", duration(s)),
        (true, None) => "alive".into(),
    }
}

/// Rows of cells, left-aligned in columns two spaces apart.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut line = |cells: Vec<String>| {
        let l: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "  {}", l.join("  ").trim_end());
    };
    line(header.iter().map(|h| (*h).to_owned()).collect());
    for r in rows {
        line(r.clone());
    }
}

pub fn status(s: &Status) -> String {
    let mut out = String::new();
    let alive = s.workers.iter().filter(|w| w.alive).count();
    let _ = writeln!(out, "at {} (Redis clock)", s.at);
    let _ = writeln!(
        out,
        "\nWorkers: {alive} alive, {} registered",
        s.workers.len()
    );
    let rows: Vec<Vec<String>> = s
        .workers
        .iter()
        .map(|w| {
            vec![
                w.name.clone(),
                opt(&w.host),
                slots(w),
                last_beat(w),
                opt(&w.version),
                w.jobs_held.to_string(),
            ]
        })
        .collect();
    table(
        &mut out,
        &[
            "NAME",
            "HOST",
            "SLOTS",
            "LAST HEARTBEAT",
            "VERSION",
            "JOBS HELD",
        ],
        &rows,
    );
    let _ = writeln!(
        out,
        "\nQueue: {} waiting, {} held by workers ({} in the stream)",
        s.queue.waiting, s.queue.held, s.queue.in_stream
    );
    let more = if s.running_truncated {
        " (more not shown)"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "\nRunning tasks: {}{more}, the longest silent first",
        s.running.len()
    );
    let rows: Vec<Vec<String>> = s
        .running
        .iter()
        .map(|t| {
            vec![
                t.task_id.clone(),
                t.state.to_string(),
                opt(&t.worker),
                opt(&t.runtime),
                t.runtime_seconds
                    .map(duration)
                    .unwrap_or_else(|| "-".into()),
                t.seconds_since_last_output
                    .map(duration)
                    .unwrap_or_else(|| "-".into()),
                t.timeout_seconds
                    .map(|s| duration(s as f64))
                    .unwrap_or_else(|| "-".into()),
                format!("{}/{}", t.stdout_bytes, t.stderr_bytes),
            ]
        })
        .collect();
    table(
        &mut out,
        &[
            "TASK",
            "STATE",
            "WORKER",
            "RUNTIME",
            "RUNNING",
            "SILENT",
            "TIMEOUT",
            "OUT/ERR BYTES",
        ],
        &rows,
    );
    let _ = writeln!(
        out,
        "\nFinished in the last hour: {}",
        s.finished_last_hour_total
    );
    let rows: Vec<Vec<String>> = s
        .finished_last_hour
        .iter()
        .map(|f| {
            vec![
                f.state.to_string(),
                f.reason_kind.to_string(),
                f.count.to_string(),
            ]
        })
        .collect();
    table(&mut out, &["STATE", "REASON KIND", "TASKS"], &rows);
    out
}

/// The record, then each stream's tail under a header.
pub fn task(t: &TaskView) -> String {
    let s = &t.status;
    let mut out = String::new();
    let mut field = |name: &str, v: String| {
        let _ = writeln!(out, "{name:<26} {v}");
    };
    field("task_id", t.task_id.clone());
    field("state", s.state.to_string());
    field("reason", opt(&s.reason));
    field("reason_kind", opt(&s.reason_kind));
    field("exit_code", opt(&s.exit_code));
    // The view reads a record without a runtime or timeout as "" and 0 (the
    // api's defaults); here they show as "-", like any field not recorded.
    field("runtime", opt(&Some(&s.runtime).filter(|r| !r.is_empty())));
    field("image", opt(&t.image));
    field("command", opt(&t.command));
    field("worker", opt(&t.worker));
    field(
        "timeout_seconds",
        opt(&Some(s.timeout_seconds).filter(|&t| t > 0)),
    );
    field("created_at", opt(&s.created_at));
    field("claimed_at", opt(&t.claimed_at));
    field("started_at", opt(&s.started_at));
    field("finished_at", opt(&s.finished_at));
    field("runtime_seconds", opt(&s.runtime_seconds));
    field(
        "seconds_since_last_output",
        opt(&s.seconds_since_last_output),
    );
    field("stdout_bytes", s.stdout_bytes.to_string());
    field("stderr_bytes", s.stderr_bytes.to_string());
    let usage = s.usage.as_ref();
    field("usage.cpu_seconds", opt(&usage.and_then(|u| u.cpu_seconds)));
    field(
        "usage.peak_memory_bytes",
        opt(&usage.and_then(|u| u.peak_memory_bytes)),
    );
    field(
        "usage.workspace_bytes",
        opt(&usage.and_then(|u| u.workspace_bytes)),
    );
    // Only when it is: the container was gone before its end could be read.
    if usage.is_some_and(|u| u.estimated) {
        field(
            "usage.estimated",
            "true (the most it could have used)".into(),
        );
    }
    field("expires_in_seconds", opt(&t.expires_in_seconds));
    for (name, tail, truncated, total) in [
        ("stdout", &s.stdout_tail, s.stdout_truncated, s.stdout_bytes),
        ("stderr", &s.stderr_tail, s.stderr_truncated, s.stderr_bytes),
    ] {
        let shown = if truncated {
            format!("last {} of {total} bytes", tail.len())
        } else {
            format!("{total} bytes")
        };
        let _ = writeln!(out, "--- {name} ({shown}) ---");
        out.push_str(tail);
        if !tail.is_empty() && !tail.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_short() {
        assert_eq!(duration(4.9), "4s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(7260.0), "2h01m");
    }
}
