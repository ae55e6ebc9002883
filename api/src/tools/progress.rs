//! `notifications/progress` for a waiting call whose request carried a
//! `progressToken`: while `run_script` (with `wait_seconds`) or
//! `get_task_status` (with its wait) waits, each change of the task (its state,
//! new output) is told to the caller on the call's own response. rmcp answers
//! a stateless request as JSON until its handler sends anything before the
//! result, then as SSE with every message in order, so a call without a token
//! is answered exactly as before, and one with a token gets a stream.
//!
//! Bounded: at most one notification per `PACE`, each message at most
//! `MESSAGE_CHARS` characters (the state, the byte counts, the newest line of
//! output); a burst of changes is told once, as it stands at the end of it.

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext};
use shared::view::StatusView;

/// The least time between two notifications to one call.
pub(super) const PACE: Duration = Duration::from_millis(200);

/// How long one notification may take to be handed to the transport.
const SEND_WAIT: Duration = Duration::from_secs(1);

/// The most characters of one notification's message.
pub(super) const MESSAGE_CHARS: usize = 300;

/// One waiting call's progress reports.
pub(super) struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    /// Notifications sent: the `progress` value, which must grow with each.
    sent: u32,
    /// What the last one told: state and output totals.
    told: Option<(shared::TaskState, u64, u64)>,
    last_at: Option<tokio::time::Instant>,
    /// Set once a notification could not be sent: the client is gone, so no
    /// more are tried.
    gone: bool,
}

impl Progress {
    /// The call's reporter, if its request asked for progress.
    pub(super) fn of(ctx: &RequestContext<RoleServer>) -> Option<Progress> {
        let token = ctx.meta.get_progress_token()?;
        Some(Progress {
            peer: ctx.peer.clone(),
            token,
            sent: 0,
            told: None,
            last_at: None,
            gone: false,
        })
    }

    /// Tells the caller `view`, unless the last notification told the same.
    /// A notification that cannot be sent (the client went away) is dropped:
    /// the call's answer is what counts.
    pub(super) async fn report(&mut self, view: &StatusView) {
        let now = (view.state, view.stdout_bytes, view.stderr_bytes);
        if self.gone || self.told == Some(now) {
            return;
        }
        self.sent += 1;
        let param = ProgressNotificationParam::new(self.token.clone(), f64::from(self.sent))
            .with_message(message(view, self.told));
        self.told = Some(now);
        self.last_at = Some(tokio::time::Instant::now());
        // Bounded: a client that stopped reading does not hold the wait.
        match tokio::time::timeout(SEND_WAIT, self.peer.notify_progress(param)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.gone = true;
                tracing::debug!(error = %e, "a progress notification was not sent");
            }
            Err(_) => {
                self.gone = true;
                tracing::debug!("a progress notification was not taken in time");
            }
        }
    }

    /// Waits out the rest of `PACE` since the last notification (never past
    /// `deadline`), so a burst of changes becomes one report.
    pub(super) async fn pace(&self, deadline: tokio::time::Instant) {
        if let Some(at) = self.last_at.filter(|_| !self.gone) {
            tokio::time::sleep_until((at + PACE).min(deadline)).await;
        }
    }
}

/// "running: 12 bytes of stdout, 0 of stderr; newest: line 3", at most
/// `MESSAGE_CHARS` characters. The newest line is the last complete or
/// partial line of the stream that grew (stdout when both did).
fn message(view: &StatusView, told: Option<(shared::TaskState, u64, u64)>) -> String {
    let (out_before, err_before) = told.map_or((0, 0), |(_, o, e)| (o, e));
    let newest = if view.stdout_bytes > out_before {
        last_line(&view.stdout_tail)
    } else if view.stderr_bytes > err_before {
        last_line(&view.stderr_tail)
    } else {
        None
    };
    let mut text = format!(
        "{}: {} bytes of stdout, {} of stderr",
        view.state, view.stdout_bytes, view.stderr_bytes
    );
    if let Some(line) = newest {
        text.push_str("; newest: ");
        text.push_str(line);
    }
    match text.char_indices().nth(MESSAGE_CHARS) {
        Some((cut, _)) => text[..cut].to_owned(),
        None => text,
    }
}

/// The last non-empty line of `tail`, without its line end.
fn last_line(tail: &str) -> Option<&str> {
    tail.lines()
        .rev()
        .map(str::trim_end)
        .find(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::TaskState;

    fn view(state: TaskState, stdout: &str, stderr: &str) -> StatusView {
        serde_json::from_value(serde_json::json!({
            "state": state,
            "runtime": "python3.13",
            "stdout_tail": stdout,
            "stderr_tail": stderr,
            "stdout_truncated": false,
            "stderr_truncated": false,
            "stdout_bytes": stdout.len(),
            "stderr_bytes": stderr.len(),
            "timeout_seconds": 300,
        }))
        .expect("a status view")
    }

    #[test]
    fn the_message_names_the_state_the_totals_and_the_newest_line_of_what_grew() {
        let v = view(TaskState::Running, "line 1\nline 2\n", "warn\n");
        assert_eq!(
            message(&v, None),
            "running: 14 bytes of stdout, 5 of stderr; newest: line 2"
        );
        // Only stderr grew since the last report: its line is the newest.
        let told = Some((TaskState::Running, 14, 0));
        assert_eq!(
            message(&v, told),
            "running: 14 bytes of stdout, 5 of stderr; newest: warn"
        );
        // Nothing grew: no line.
        let told = Some((TaskState::Queued, 14, 5));
        assert_eq!(
            message(&v, told),
            "running: 14 bytes of stdout, 5 of stderr"
        );
    }

    #[test]
    fn the_message_is_bounded_on_a_character_boundary() {
        let long = "é".repeat(1000);
        let v = view(TaskState::Running, &long, "");
        let m = message(&v, None);
        assert_eq!(m.chars().count(), MESSAGE_CHARS);
        assert!(m.starts_with("running: 2000 bytes of stdout"));
    }
}
