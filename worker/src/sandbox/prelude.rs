//! What runs first in every task's container, cold or warm: the shell prelude.
//! It is the container's own first process (under docker-init), started before
//! any task is known. It waits on its stdin for exactly one task: the worker's
//! handoff, one line of shell assignments (`handoff_line`) followed by the
//! task's stdin. It then copies the zip's files in, runs the user's command
//! under the container's own deadline, with `collect` archives the files asked
//! for into the collection pipe, and reports the command's exit status itself,
//! in the output streams (`Marker`), before it goes idle so the container and
//! its cgroup stay until the worker has read them.
//!
//! So a task is handed over without a `docker exec`, and its end is known the
//! moment the script exits, not when the engine has finished with a process.

/// Where the collection pipe (a FIFO the worker reads) is mounted.
pub(super) const COLLECT_MOUNT: &str = "/.sr-collect";

/// Where the extracted zip is mounted (read-only) before it is copied to /workspace.
pub(super) const SOURCE_MOUNT: &str = "/.sr-source";

/// Where a workspace task's restored version is mounted (read-only): copied to
/// /workspace first, the zip over it.
pub(super) const RESTORE_MOUNT: &str = "/.sr-restore";

/// How long the prelude stays idle after the task's exit status is out: the
/// worker reads the cgroup within milliseconds and then stops the container;
/// short, because a container whose worker died must end soon after its task
/// (as it did when a cold container's first process slept until the deadline
/// plus 5 s).
const IDLE_AFTER_SECONDS: u64 = 10;

/// The variables every container gets; a task's own come with its handoff.
pub(super) fn task_env(extra: &[(String, String)]) -> Vec<String> {
    let mut env: Vec<String> = extra.iter().map(|(k, v)| format!("{k}={v}")).collect();
    env.extend([
        "HOME=/tmp".to_owned(),
        "LANG=C.UTF-8".to_owned(),
        "PYTHONUNBUFFERED=1".to_owned(),
    ]);
    env
}

/// The container's command, the same for every container: the prelude.
///
/// It reads one line (`read` takes a pipe byte by byte, so the task's stdin
/// after it is left to the script) and evaluates it: the worker wrote it, every
/// value single-quoted (`handoff_line`), so it only assigns `n` (the marker's
/// nonce), `z` (a zip to copy), `c` (collect), the positional parameters
/// (command, deadline, patterns) and exports the task's variables. End of input
/// before a line means no task will come (the worker let go of the container,
/// or died): the prelude exits, and the container with it.
///
/// The command runs under `timeout -s KILL <deadline>` where the image has
/// `timeout` (coreutils or busybox), else directly, with `$HOME/.local/bin`
/// appended to PATH, as a child: the prelude stays its parent, so it learns
/// the exit status (`$?`) first hand and writes it out. With collect, the
/// files matching the patterns are archived to the collection pipe first:
/// only regular files reached without a link (find does not follow links;
/// realpath drops paths through a linked directory) and inside /workspace.
/// The user's command is a positional parameter, never spliced into a script.
pub(super) fn container_command() -> Vec<String> {
    let script = format!(
        "nl='\n'\n\
         IFS= read -r h || exit 0\n\
         eval \"$h\"\n\
         if [ \"$w\" = 1 ]; then {{ [ \"$r\" != 1 ] || cp -R {RESTORE_MOUNT}/. /workspace/; }} \
         && {{ [ \"$z\" != 1 ] || cp -R {SOURCE_MOUNT}/. /workspace/; }} \
         || {{ echo 'script-runner: the workspace could not be copied into /workspace' >&2; exit 125; }}; z=0; fi\n\
         printf '%sS---' \"$n\"\n\
         run() {{ cd /workspace && export PATH=\"$PATH:$HOME/.local/bin\" && \
         if command -v timeout >/dev/null 2>&1; \
         then timeout -s KILL \"$2\" sh -c \"$1\"; else sh -c \"$1\"; fi; }}\n\
         if [ \"$z\" = 1 ]; then cp -R {SOURCE_MOUNT}/. /workspace/ && run \"$@\"; else run \"$@\"; fi\n\
         rc=$?\n\
         if [ \"$c\" = 1 ]; then shift 2; \
         for pat in \"$@\"; do for f in $pat; do find \"$f\" -type f -print 2>/dev/null; done; done \
         | while IFS= read -r f; do case \"$(realpath -- \"$f\" 2>/dev/null)\" in /workspace/*) printf '%s\\n' \"$f\";; esac; done \
         | tar -cf - -T - 2>/dev/null > {COLLECT_MOUNT}; fi\n\
         printf '%sE%03d' \"$n\" \"$rc\"\n\
         printf '%sE---' \"$n\" >&2\n\
         exec sleep {IDLE_AFTER_SECONDS}\n"
    );
    vec!["sh".to_owned(), "-c".to_owned(), script]
}

/// What a task's handoff line carries.
pub(super) struct Handoff<'a> {
    /// The marker's nonce (`Marker::new`): hex, so it needs no quoting.
    pub nonce: &'a str,
    pub command: &'a str,
    pub has_source: bool,
    /// A restored workspace version is mounted at `RESTORE_MOUNT`.
    pub has_restore: bool,
    /// A workspace task: its files (the restored version, then the zip) are
    /// copied in before the start marker, so a task stopped at any point
    /// after it has its /workspace whole (one that cannot be copied ends the
    /// prelude before the marker: nothing runs, and nothing is saved).
    pub workspace: bool,
    pub deadline_seconds: u64,
    pub collect: &'a [String],
    pub env: &'a [(String, String)],
}

/// A value the shell cannot hold.
#[derive(Debug, thiserror::Error)]
#[error("the task's {0} contains a NUL byte, which no process argument or variable can hold")]
pub struct NulByte(&'static str);

/// The handoff's first line, ending in a newline: shell assignments the
/// prelude evaluates. Every value is single-quoted (a `'` inside becomes
/// `'\''`), and a newline inside one becomes `'"$nl"'` (the prelude sets `nl`),
/// so the line holds no newline but its last and evaluating it runs nothing of
/// the task's.
pub(super) fn handoff_line(h: &Handoff<'_>) -> Result<Vec<u8>, NulByte> {
    let mut line = format!(
        "n={}; z={}; r={}; w={}; c={}; set -- {} {}",
        h.nonce,
        u8::from(h.has_source),
        u8::from(h.has_restore),
        u8::from(h.workspace),
        u8::from(!h.collect.is_empty()),
        quote(h.command, "command")?,
        h.deadline_seconds
    );
    for pattern in h.collect {
        line.push(' ');
        line.push_str(&quote(pattern, "collect pattern")?);
    }
    if !h.env.is_empty() {
        line.push_str("; export");
        for (k, v) in h.env {
            line.push(' ');
            line.push_str(&quote(&format!("{k}={v}"), "environment")?);
        }
    }
    line.push('\n');
    Ok(line.into_bytes())
}

fn quote(value: &str, what: &'static str) -> Result<String, NulByte> {
    if value.contains('\0') {
        return Err(NulByte(what));
    }
    Ok(format!(
        "'{}'",
        value.replace('\'', r"'\''").replace('\n', "'\"$nl\"'")
    ))
}

/// What the prelude says in the output streams, after a nonce only the worker
/// and the prelude know, so no output of the task's can pass for it: on
/// stdout `<nonce>S---` once it has the task (before anything of it runs),
/// and `<nonce>E<3 digits>` with the exit status once the script has exited
/// (and collect is written); on stderr `<nonce>E---` then. All of the script's
/// output comes before its stream's end marker.
pub struct Marker {
    nonce: Vec<u8>,
    /// Horspool's shifts for the nonce (`find`).
    shifts: [u8; 256],
}

/// A marker seen in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The prelude has the task (stdout).
    Started,
    /// The script exited with this status (stdout).
    Exited(i64),
    /// The script's stderr is complete.
    StderrEnd,
}

/// How many bytes follow the nonce in a marker.
const TAG_LEN: usize = 4;

impl Marker {
    pub fn new() -> Marker {
        let nonce = uuid::Uuid::new_v4().simple().to_string().into_bytes();
        let m = nonce.len();
        let mut shifts = [m as u8; 256];
        for (i, &b) in nonce[..m - 1].iter().enumerate() {
            shifts[usize::from(b)] = (m - 1 - i) as u8;
        }
        Marker { nonce, shifts }
    }

    pub(super) fn nonce(&self) -> &str {
        std::str::from_utf8(&self.nonce).unwrap_or_default()
    }

    /// Whether `data` can pass as it is: nothing held back before it, no
    /// marker in it, and no end of it that could begin one. (The common case:
    /// no copy.)
    pub fn passes(&self, pending: &[u8], data: &[u8]) -> bool {
        pending.is_empty() && self.find(data).is_none() && self.held_back(data) == 0
    }

    /// How many bytes at the end of `data` could begin a marker.
    fn held_back(&self, data: &[u8]) -> usize {
        (1..self.nonce.len().min(data.len() + 1))
            .rev()
            .find(|&k| data.ends_with(&self.nonce[..k]))
            .unwrap_or(0)
    }

    /// Takes the markers out of one stream's bytes. `pending` holds what an
    /// earlier call kept back (the start of a marker, perhaps); what it keeps
    /// back now is put there. Returns the task's own bytes, in order, and the
    /// markers seen.
    pub fn scan(&self, pending: &mut Vec<u8>, data: &[u8]) -> (Vec<u8>, Vec<Seen>) {
        pending.extend_from_slice(data);
        let mut out = Vec::new();
        let mut seen = Vec::new();
        let n = self.nonce.len();
        loop {
            match self.find(pending) {
                Some(at) if pending.len() >= at + n + TAG_LEN => {
                    out.extend_from_slice(&pending[..at]);
                    let tag = &pending[at + n..at + n + TAG_LEN];
                    match parse_tag(tag) {
                        Some(s) => seen.push(s),
                        // Not one of ours after all: the task's bytes.
                        None => out.extend_from_slice(&pending[at..at + n + TAG_LEN]),
                    }
                    pending.drain(..at + n + TAG_LEN);
                }
                Some(at) => {
                    // The marker's tag has not arrived yet.
                    out.extend_from_slice(&pending[..at]);
                    pending.drain(..at);
                    break;
                }
                None => {
                    // Keep back the longest end that could begin a marker.
                    let keep = self.held_back(pending);
                    let cut = pending.len() - keep;
                    out.extend_from_slice(&pending[..cut]);
                    pending.drain(..cut);
                    break;
                }
            }
        }
        (out, seen)
    }
}

impl Default for Marker {
    fn default() -> Self {
        Marker::new()
    }
}

impl Marker {
    /// Where the nonce first occurs in `haystack`. Every byte of a task's
    /// output passes through here (a 2 GiB flood in the hostile suite), so it
    /// is Horspool's search, which looks at about one byte in 32 of output
    /// unlike the nonce, rather than at every position.
    fn find(&self, haystack: &[u8]) -> Option<usize> {
        let m = self.nonce.len();
        let mut at = 0;
        while at + m <= haystack.len() {
            let last = haystack[at + m - 1];
            if last == self.nonce[m - 1] && haystack[at..at + m] == self.nonce[..] {
                return Some(at);
            }
            at += usize::from(self.shifts[usize::from(last)]);
        }
        None
    }
}

fn parse_tag(tag: &[u8]) -> Option<Seen> {
    match tag {
        b"S---" => Some(Seen::Started),
        b"E---" => Some(Seen::StderrEnd),
        [b'E', digits @ ..] if digits.iter().all(u8::is_ascii_digit) => std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse().ok())
            .map(Seen::Exited),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(command: &str, env: &[(String, String)], collect: &[String]) -> String {
        let h = Handoff {
            nonce: "abc",
            command,
            has_source: true,
            has_restore: false,
            workspace: false,
            deadline_seconds: 65,
            collect,
            env,
        };
        String::from_utf8(handoff_line(&h).expect("line")).expect("utf-8")
    }

    /// The line, evaluated by a real shell as the prelude does, gives back
    /// every value unchanged and runs nothing of them.
    #[test]
    fn the_handoff_line_gives_the_shell_each_value_unchanged_and_runs_none() {
        let evil = "echo \"$2\"; rm -rf / ; `id`\n$(touch /tmp/x) 'q' \\ \r\tend\n";
        let env = vec![("A_B".to_owned(), "it's\nme; $(id)".to_owned())];
        let collect = vec!["out/*.txt".to_owned(), "a'b".to_owned()];
        let l = line(evil, &env, &collect);
        assert_eq!(l.matches('\n').count(), 1, "{l}");
        assert!(l.ends_with('\n'));
        let script = "nl='\n'\nIFS= read -r h\neval \"$h\"\n\
                      printf '%s|' \"$n\" \"$z\" \"$c\" \"$@\" \"$A_B\"";
        for shell in ["sh", "dash", "bash", "busybox"] {
            let mut cmd = std::process::Command::new(shell);
            if shell == "busybox" {
                cmd.arg("sh");
            }
            let Ok(mut child) = cmd
                .args(["-c", script])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
            else {
                continue;
            };
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(l.as_bytes())
                .expect("write");
            let out = child.wait_with_output().expect("shell");
            let want = format!("abc|1|1|{evil}|65|out/*.txt|a'b|it's\nme; $(id)|");
            assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{shell}");
        }
    }

    #[test]
    fn a_nul_byte_is_refused_naming_where() {
        let h = Handoff {
            nonce: "abc",
            command: "echo a\0b",
            has_source: false,
            has_restore: false,
            workspace: false,
            deadline_seconds: 1,
            collect: &[],
            env: &[],
        };
        let e = handoff_line(&h).expect_err("refused");
        assert!(e.to_string().contains("command"), "{e}");
    }

    #[test]
    fn markers_are_taken_out_of_the_stream_even_cut_across_frames() {
        let m = Marker::new();
        let nonce = m.nonce().to_owned();
        let stream = format!("{nonce}S---hello {}world{nonce}E137", &nonce[..5]);
        // Every way of cutting the stream in two frames gives the same result.
        for cut in 0..stream.len() {
            let mut pending = Vec::new();
            let (a, mut seen) = m.scan(&mut pending, &stream.as_bytes()[..cut]);
            let (b, more) = m.scan(&mut pending, &stream.as_bytes()[cut..]);
            seen.extend(more);
            let out = [a, b].concat();
            assert_eq!(
                String::from_utf8(out).expect("utf-8"),
                format!("hello {}world", &nonce[..5]),
                "cut at {cut}"
            );
            assert_eq!(seen, [Seen::Started, Seen::Exited(137)], "cut at {cut}");
            assert!(pending.is_empty());
        }
        let mut pending = Vec::new();
        let (out, seen) = m.scan(&mut pending, format!("x{nonce}E---").as_bytes());
        assert_eq!((out, seen), (b"x".to_vec(), vec![Seen::StderrEnd]));
        // Another nonce is output like any other.
        let other = Marker::new();
        let text = format!("{}E000", other.nonce());
        let mut pending = Vec::new();
        let (mut out, seen) = m.scan(&mut pending, text.as_bytes());
        out.extend(pending);
        assert_eq!((out, seen), (text.into_bytes(), vec![]));
    }
}
