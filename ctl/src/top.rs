//! `top`: the status, redrawn every interval in the terminal (ratatui on
//! crossterm). `q`, Esc or Ctrl-C quits.

use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};

use crate::CtlError;
use crate::read::{Reader, Status};
use crate::render::{duration, last_beat, slots};

/// A task silent this long is drawn in red.
const SILENT_WARN_SECONDS: f64 = 60.0;

/// Runs until the user quits. A failed read is shown on screen and retried at
/// the next refresh; the view is never torn down by a Redis hiccup.
pub async fn run(reader: &Reader, every: Duration, prefix: &str) -> Result<(), CtlError> {
    let mut terminal = ratatui::try_init()?;
    let result = async {
        loop {
            let read = reader.status().await;
            terminal.draw(|f| draw(f, &read, prefix))?;
            let next = Instant::now() + every;
            while let Some(left) = next.checked_duration_since(Instant::now()) {
                if event::poll(left.min(Duration::from_millis(200)))?
                    && let Event::Key(k) = event::read()?
                    && k.kind == KeyEventKind::Press
                    && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
                        || (k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL)))
                {
                    return Ok::<(), CtlError>(());
                }
            }
        }
    }
    .await;
    ratatui::try_restore()?;
    result
}

/// One screen: a summary line, then workers, running tasks (stuck-looking
/// first) and what finished in the last hour.
pub fn draw(f: &mut Frame, read: &Result<Status, CtlError>, prefix: &str) {
    let s = match read {
        Ok(s) => s,
        Err(e) => {
            let p = Paragraph::new(vec![
                Line::from(format!("script-runner top · prefix {prefix} · q quits")),
                Line::from(format!("cannot read Redis: {e}")).red(),
            ]);
            f.render_widget(p, f.area());
            return;
        }
    };
    let workers_h = s.workers.len().clamp(1, 12) as u16 + 3;
    let finished_h = s.finished_last_hour.len().clamp(1, 10) as u16 + 3;
    let [head, workers, running, finished] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(workers_h),
        Constraint::Min(5),
        Constraint::Length(finished_h),
    ])
    .areas(f.area());

    let alive = s.workers.iter().filter(|w| w.alive).count();
    let header = Paragraph::new(vec![
        Line::from(format!(
            "script-runner top · prefix {prefix} · {} · q quits",
            s.at
        ))
        .bold(),
        Line::from(format!(
            "queue: {} waiting · {} held · running {} · workers {alive} alive / {} · finished last hour {}",
            s.queue.waiting,
            s.queue.held,
            s.running.len(),
            s.workers.len(),
            s.finished_last_hour_total
        )),
    ]);
    f.render_widget(header, head);

    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rows = s.workers.iter().map(|w| {
        let row = Row::new(vec![
            w.name.clone(),
            w.host.clone().unwrap_or_else(|| "-".into()),
            slots(w),
            last_beat(w),
            w.version.clone().unwrap_or_else(|| "-".into()),
            w.jobs_held.to_string(),
        ]);
        if w.alive { row } else { row.red() }
    });
    let table = Table::new(
        rows,
        [
            Constraint::Fill(2),
            Constraint::Fill(2),
            Constraint::Length(7),
            Constraint::Length(15),
            Constraint::Length(10),
            Constraint::Length(9),
        ],
    )
    .header(
        Row::new([
            "WORKER",
            "HOST",
            "SLOTS",
            "LAST HEARTBEAT",
            "VERSION",
            "JOBS",
        ])
        .style(bold),
    )
    .block(Block::bordered().title(format!(" Workers ({alive} alive) ")));
    f.render_widget(table, workers);

    let dash = || "-".to_owned();
    let rows = s.running.iter().map(|t| {
        let silent = t.seconds_since_last_output;
        let row = Row::new(vec![
            t.task_id.clone(),
            t.worker.clone().unwrap_or_else(dash),
            t.runtime.clone().unwrap_or_else(dash),
            t.runtime_seconds.map(duration).unwrap_or_else(dash),
            silent.map(duration).unwrap_or_else(dash),
            t.timeout_seconds
                .map(|s| duration(s as f64))
                .unwrap_or_else(dash),
            format!("{}/{}", t.stdout_bytes, t.stderr_bytes),
        ]);
        if silent.is_some_and(|s| s >= SILENT_WARN_SECONDS) {
            row.red()
        } else {
            row
        }
    });
    let more = if s.running_truncated {
        ", more not shown"
    } else {
        ""
    };
    let table = Table::new(
        rows,
        [
            Constraint::Length(36),
            Constraint::Fill(1),
            Constraint::Length(11),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(14),
        ],
    )
    .header(
        Row::new([
            "TASK",
            "WORKER",
            "RUNTIME",
            "RUNNING",
            "SILENT",
            "TIMEOUT",
            "OUT/ERR BYTES",
        ])
        .style(bold),
    )
    .block(Block::bordered().title(format!(
        " Running tasks ({}{more}), longest silent first ",
        s.running.len()
    )));
    f.render_widget(table, running);

    let rows = s.finished_last_hour.iter().map(|c| {
        Row::new(vec![
            c.state.to_string(),
            c.reason_kind.to_string(),
            c.count.to_string(),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(12),
            Constraint::Length(20),
            Constraint::Length(8),
        ],
    )
    .header(Row::new(["STATE", "REASON KIND", "TASKS"]).style(bold))
    .block(Block::bordered().title(format!(
        " Finished in the last hour ({}) ",
        s.finished_last_hour_total
    )));
    f.render_widget(table, finished);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::{FinishedCount, QueueView, RunningTask, WorkerView};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use shared::{ReasonKind, TaskState};

    #[test]
    fn a_screen_shows_workers_running_tasks_and_the_hour() {
        let s = Status {
            at: "2026-11-30T05:00:00.000Z".into(),
            workers: vec![WorkerView {
                name: "w-one".into(),
                alive: true,
                host: Some("host-a".into()),
                slots_busy: Some(1),
                slots_total: Some(4),
                last_heartbeat_seconds_ago: Some(2.0),
                version: Some("0.1.0".into()),
                jobs_held: 1,
            }],
            queue: QueueView {
                waiting: 3,
                held: 1,
                in_stream: 4,
            },
            running: vec![RunningTask {
                task_id: "0b5c9a4e-0000-4000-8000-000000000001".into(),
                state: TaskState::Running,
                worker: Some("w-one".into()),
                runtime: Some("python3.13".into()),
                runtime_seconds: Some(75.0),
                seconds_since_last_output: Some(70.0),
                timeout_seconds: Some(300),
                stdout_bytes: 6,
                stderr_bytes: 0,
            }],
            running_truncated: false,
            finished_last_hour: vec![FinishedCount {
                state: TaskState::Succeeded,
                reason_kind: ReasonKind::Exited,
                count: 7,
            }],
            finished_last_hour_total: 7,
        };
        let mut t = Terminal::new(TestBackend::new(140, 30)).expect("terminal");
        t.draw(|f| draw(f, &Ok(s), "sr")).expect("draw");
        let screen: String = t
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        for want in [
            "w-one",
            "host-a",
            "1/4",
            "2s ago",
            "0b5c9a4e-0000-4000-8000-000000000001",
            "1m15s",
            "1m10s",
            "3 waiting",
            "succeeded",
            "Finished in the last hour (7)",
        ] {
            assert!(screen.contains(want), "{want:?} not on screen:\n{screen}");
        }
    }
}
