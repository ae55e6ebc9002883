//! What runs first in every task's container, cold or warm: the shell prelude
//! that copies the zip's files in, runs the user's command under the container's
//! own deadline and, with `collect`, archives the files asked for into the
//! collection pipe; and the environment every task gets.

/// Where the collection pipe (a FIFO the worker reads) is mounted.
pub(super) const COLLECT_MOUNT: &str = "/.sr-collect";

/// Where the extracted zip is mounted (read-only) before it is copied to /workspace.
pub(super) const SOURCE_MOUNT: &str = "/.sr-source";

/// The variables every task gets, after the task's own: the api refuses the
/// reserved names, and a later duplicate would win anyway.
pub(super) fn task_env(extra: &[(String, String)]) -> Vec<String> {
    let mut env: Vec<String> = extra.iter().map(|(k, v)| format!("{k}={v}")).collect();
    env.extend([
        "HOME=/tmp".to_owned(),
        "LANG=C.UTF-8".to_owned(),
        "PYTHONUNBUFFERED=1".to_owned(),
    ]);
    env
}

/// The container's command: copy the zip's files in (if any), then run the user's
/// command under `timeout -s KILL <deadline>` where the image has `timeout`
/// (coreutils or busybox), else directly, with `$HOME/.local/bin` appended to
/// PATH. The user's command is passed as `$1`,
/// never spliced into the script, so no quoting of it is ever needed.
pub(super) fn container_command(
    command: &str,
    has_source: bool,
    deadline_seconds: u64,
    collect: &[String],
) -> Vec<String> {
    let copy = if has_source {
        format!("cp -R {SOURCE_MOUNT}/. /workspace/ && ")
    } else {
        String::new()
    };
    // `pip install --user` puts console scripts (pytest, ...) in ~/.local/bin:
    // on PATH, after the image's own directories, they run by name.
    let setup = format!("{copy}cd /workspace && export PATH=\"$PATH:$HOME/.local/bin\" && ");
    // Without collect the script replaces the prelude (exec); with it, the
    // script runs as a child so the prelude goes on after it: the files matching
    // the patterns ($3...) are archived to the collection pipe, which the worker
    // reads. Only regular files reached without a link (find does not follow
    // links; realpath drops paths through a linked directory) and inside
    // /workspace are taken.
    let exec = if collect.is_empty() { "exec " } else { "" };
    let run = format!(
        "{setup}if command -v timeout >/dev/null 2>&1; \
         then {exec}timeout -s KILL \"$2\" sh -c \"$1\"; else {exec}sh -c \"$1\"; fi"
    );
    let script = if collect.is_empty() {
        run
    } else {
        format!(
            "{run}; rc=$?; \
             shift 2; for pat in \"$@\"; do for f in $pat; do find \"$f\" -type f -print 2>/dev/null; done; done \
             | while IFS= read -r f; do case \"$(realpath -- \"$f\" 2>/dev/null)\" in /workspace/*) printf '%s\\n' \"$f\";; esac; done \
             | tar -cf - -T - 2>/dev/null > {COLLECT_MOUNT}; exit $rc"
        )
    };
    let fixed = [
        "sh".to_owned(),
        "-c".to_owned(),
        script,
        "sh".to_owned(),
        command.to_owned(),
        deadline_seconds.to_string(),
    ];
    fixed.into_iter().chain(collect.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_command_is_an_argument_never_part_of_the_script() {
        let evil = "echo \"$2\"; rm -rf / ; `id`";
        let cmd = container_command(evil, true, 65, &[]);
        assert_eq!(cmd.len(), 6);
        assert_eq!(&cmd[..2], ["sh", "-c"]);
        assert!(cmd[2].starts_with("cp -R /.sr-source/. /workspace/ && cd /workspace"));
        assert!(!cmd[2].contains("rm -rf"));
        assert_eq!((cmd[4].as_str(), cmd[5].as_str()), (evil, "65"));
        assert!(cmd[2].contains("timeout -s KILL \"$2\" sh -c \"$1\""));
        assert!(cmd[2].contains("export PATH=\"$PATH:$HOME/.local/bin\" && "));
        let no_zip = container_command("true", false, 10, &[]);
        assert!(no_zip[2].starts_with("cd /workspace && "));
    }
}
