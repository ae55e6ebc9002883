//! A task handed to its container (cold or warm), without a `docker exec`: the
//! container's prelude, attached since before it started, waits on its stdin;
//! `hand_off` writes it the task (one line, then the task's stdin) and waits
//! for the prelude to say it has it. `TaskOutput` is the task's output from
//! then on, with the prelude's markers (`Seen`) taken out: its start, and the
//! script's exit status the moment it exits.

use std::collections::VecDeque;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::RenameContainerOptionsBuilder;
use futures_util::StreamExt;
use shared::task::self_deadline_seconds;

use super::prelude::{Handoff, Marker, Seen, handoff_line};
use super::{ContainerSpec, OutputStream, Sandbox, SandboxError, StdinWriter};
use crate::metrics::Op;

/// How long `hand_off` waits for the prelude to say it has the task (it
/// usually does within a few milliseconds). One that says nothing by then is
/// taken as started: supervision finds out how it ends, and a task must never
/// run twice.
const START_WAIT: Duration = Duration::from_secs(10);

/// A container's streams, attached before it started.
pub struct Attached {
    pub output: OutputStream,
    pub input: StdinWriter,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Attached")
    }
}

/// What comes out of a task's container: its output, and the prelude's markers.
pub enum Event {
    Frame(LogOutput),
    Marker(Seen),
}

/// A task's output stream with the prelude's markers taken out.
pub struct TaskOutput {
    stream: OutputStream,
    marker: Marker,
    /// What each stream holds back (a marker's start, perhaps).
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    queue: VecDeque<Event>,
    /// The stream's end (or failure) was seen; `failed` is returned once, last.
    ended: bool,
    failed: Option<DockerError>,
}

impl TaskOutput {
    fn new(stream: OutputStream, marker: Marker) -> TaskOutput {
        TaskOutput {
            stream,
            marker,
            stdout: Vec::new(),
            stderr: Vec::new(),
            queue: VecDeque::new(),
            ended: false,
            failed: None,
        }
    }

    /// The next piece of output or marker; `None` once the stream has ended.
    /// Cancel-safe (a `select!` branch): nothing is awaited between taking a
    /// frame off the stream and queueing what it held.
    pub async fn next(&mut self) -> Option<Result<Event, DockerError>> {
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Some(Ok(e));
            }
            if self.ended {
                return self.failed.take().map(Err);
            }
            match self.stream.next().await {
                Some(Ok(frame)) => self.take(frame),
                Some(Err(e)) => {
                    self.flush();
                    self.ended = true;
                    self.failed = Some(e);
                }
                None => {
                    self.flush();
                    self.ended = true;
                }
            }
        }
    }

    /// What has already arrived, without waiting: after the script's end, the
    /// output its leftover processes wrote meanwhile.
    pub fn ready(&mut self) -> Vec<Event> {
        use futures_util::FutureExt;
        let mut out = Vec::new();
        while let Some(Some(Ok(e))) = self.next().now_or_never() {
            out.push(e);
        }
        out
    }

    fn take(&mut self, frame: LogOutput) {
        let (pending, message, stdout) = match &frame {
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                (&mut self.stdout, message, true)
            }
            LogOutput::StdErr { message } => (&mut self.stderr, message, false),
            LogOutput::StdIn { .. } => return,
        };
        if self.marker.passes(pending, message) {
            self.queue.push_back(Event::Frame(frame));
            return;
        }
        let (bytes, seen) = self.marker.scan(pending, message);
        if !bytes.is_empty() {
            self.queue.push_back(Event::Frame(frame_of(stdout, bytes)));
        }
        self.queue.extend(seen.into_iter().map(Event::Marker));
    }

    /// The stream ended: what was held back was the task's own output.
    fn flush(&mut self) {
        for (stdout, pending) in [(true, &mut self.stdout), (false, &mut self.stderr)] {
            if !pending.is_empty() {
                let bytes = std::mem::take(pending);
                self.queue.push_back(Event::Frame(frame_of(stdout, bytes)));
            }
        }
    }
}

fn frame_of(stdout: bool, bytes: Vec<u8>) -> LogOutput {
    let message = bytes.into();
    if stdout {
        LogOutput::StdOut { message }
    } else {
        LogOutput::StdErr { message }
    }
}

impl Sandbox {
    /// Hands a started container (its own, or a warm one) its task: writes the
    /// prelude the handoff line and then the task's stdin (if any) and closes
    /// it, in the background (a script that reads slowly must not hold this
    /// up); waits until the prelude says it has the task. With `rename` (a warm
    /// one), renames the container `sr-<task_id>` meanwhile, so it is found by
    /// name like a cold one.
    ///
    /// An output that ends before the prelude's word means nothing of the task
    /// ran (the container had died, or its prelude did before it read the task):
    /// `HandoffNotTaken`, so a warm task can go cold without running twice.
    pub async fn hand_off(
        &self,
        container: &str,
        attached: Attached,
        spec: &ContainerSpec<'_>,
        stdin: Option<Vec<u8>>,
        rename: bool,
    ) -> Result<TaskOutput, SandboxError> {
        let marker = Marker::new();
        let mut line = handoff_line(&Handoff {
            nonce: marker.nonce(),
            command: spec.command,
            has_source: spec.source.is_some(),
            has_restore: spec.restore.is_some(),
            workspace: spec.workspace,
            deadline_seconds: self_deadline_seconds(spec.timeout_seconds),
            collect: spec.collect.map_or(&[][..], |(_, patterns)| patterns),
            env: spec.env,
        })?;
        line.extend(stdin.unwrap_or_default());
        tokio::spawn(feed(attached.input, line, spec.task_id.to_owned()));
        let mut output = TaskOutput::new(attached.output, marker);
        let rename = async {
            if !rename {
                return Ok(());
            }
            let opts = RenameContainerOptionsBuilder::default()
                .name(&spec.container_name())
                .build();
            self.docker.rename_container(container, opts).await
        };
        let taken = self.metrics.docker(Op::Handoff, async {
            let wait = async {
                let mut early = Vec::new();
                loop {
                    match output.next().await {
                        Some(Ok(Event::Marker(Seen::Started))) => return Ok(early),
                        Some(Ok(e)) => early.push(e),
                        Some(Err(_)) | None => return Err(SandboxError::HandoffNotTaken),
                    }
                }
            };
            match tokio::time::timeout(START_WAIT, wait).await {
                Ok(taken) => taken,
                Err(_) => {
                    tracing::warn!(
                        container,
                        "no word from the prelude on its task; supervising it anyway"
                    );
                    Ok(Vec::new())
                }
            }
        });
        let (renamed, taken) = tokio::join!(rename, taken);
        if let Err(e) = renamed {
            tracing::debug!(container, error = %e, "could not rename the pool container");
        }
        // Output before the start marker (none is expected) is the task's, first.
        for e in taken?.into_iter().rev() {
            output.queue.push_front(e);
        }
        Ok(output)
    }
}

/// Writes the handoff (the line, then the task's stdin), then closes the
/// container's stdin, so the script sees EOF.
async fn feed(mut input: StdinWriter, bytes: Vec<u8>, task_id: String) {
    use tokio::io::AsyncWriteExt;
    let written = async {
        input.write_all(&bytes).await?;
        input.flush().await?;
        input.shutdown().await
    };
    // A script that exits without reading all of its stdin breaks the pipe: not
    // an error.
    if let Err(e) = written.await {
        tracing::debug!(task_id, error = %e, "handoff not fully delivered");
    }
}
