//! Images pinned by digest (docs/deploy.md, "Images pinned by digest"), against
//! a real registry: `deploy/pin-images.sh` writes each tag of a deployment's
//! `.env` as `NAME:TAG@sha256:...`, a tag moved upstream afterwards changes
//! nothing a worker runs (it pulls the pinned digest, not the tag), and
//! `--repin` takes the moved tag on purpose.

use std::path::Path;
use std::process::Command;

use script_runner_e2e::*;
use serde_json::json;
use testkit::registry::Registry;

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Runs deploy/pin-images.sh on `env` with `args`: its exit success and stderr.
fn pin_images(env: &Path, args: &[&str]) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/pin-images.sh");
    let out = Command::new(script)
        .arg("--env")
        .arg(env)
        .args(args)
        .output()
        .expect("pin-images.sh runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn setting(env: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(env).expect(".env");
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_tag_moved_after_pinning_changes_nothing_a_worker_runs_until_repinned() {
    let registry = Registry::start().await;
    let python = format!("{}/sr/python:3.13", registry.host());
    let base = format!("{}/sr/base:trixie", registry.host());
    for (local, pushed) in [
        (runtime_image(), python.clone()),
        (
            std::env::var("TEST_BASE_IMAGE")
                .unwrap_or_else(|_| "script-runner-test/base:trixie".into()),
            base.clone(),
        ),
    ] {
        docker(&["tag", &local, &pushed]);
        docker(&["push", "-q", &pushed]);
    }

    // A deployment's .env naming tags (every default runtime replaced: the
    // public registry's are out of reach here).
    let dir = tempfile_dir();
    let env = dir.join(".env");
    std::fs::write(
        &env,
        format!(
            "BINARIES=prebuilt\nBASE_IMAGE={base}\n\
             RUNTIME_IMAGES=python3.13={python},python3.8={python},node24={python}\n"
        ),
    )
    .expect("write .env");
    let (ok, said) = pin_images(&env, &["--check"]);
    assert!(!ok && said.contains("not pinned by digest"), "{said}");

    let (ok, said) = pin_images(&env, &[]);
    assert!(ok, "{said}");
    let pinned = setting(&env, "RUNTIME_IMAGES");
    let first = pinned
        .split(',')
        .find_map(|p| p.strip_prefix("python3.13="))
        .expect("python3.13 pinned")
        .to_owned();
    assert!(first.starts_with(&format!("{python}@sha256:")), "{pinned}");
    let digest = first.rsplit('@').next().expect("digest").to_owned();
    assert!(pinned.split(',').all(|p| p.ends_with(&digest)), "{pinned}");
    assert!(
        setting(&env, "BASE_IMAGE").starts_with(&format!("{base}@sha256:")),
        "{}",
        std::fs::read_to_string(&env).unwrap_or_default()
    );
    let (ok, said) = pin_images(&env, &["--check"]);
    assert!(ok, "{said}");

    // The tag moves: another image pushed under it.
    let moved = Command::new("docker")
        .args(["build", "-q", "-t", &python, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            let dockerfile = format!("FROM {}\nRUN echo moved > /etc/sr-moved\n", runtime_image());
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(dockerfile.as_bytes())?;
            child.wait()
        })
        .expect("docker build");
    assert!(moved.success());
    docker(&["push", "-q", &python]);
    // Pinning again without --repin keeps the pin.
    let (ok, said) = pin_images(&env, &[]);
    assert!(ok, "{said}");
    assert_eq!(setting(&env, "RUNTIME_IMAGES"), pinned);

    // The worker has no copy under the pinned name: it pulls that digest.
    let _ = Command::new("docker")
        .args(["rmi", &format!("{}/sr/python@{digest}", registry.host())])
        .output();
    let stack = Stack::start(Options {
        extra_env: vec![
            ("RUNTIME_IMAGES", pinned.clone()),
            ("POOL_SIZE", "0".into()),
            ("EGRESS_POOL_SIZE", "0".into()),
        ],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let status = run_to_end(
        &client,
        "python3.13",
        "cat /etc/sr-moved 2>/dev/null || echo pinned",
        json!({}),
    )
    .await;
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(status["stdout_tail"], "pinned\n", "{status}");
    stack.shutdown().await;

    // --repin takes the moved tag, and says so.
    let (ok, said) = pin_images(&env, &["--repin"]);
    assert!(ok, "{said}");
    let repinned = setting(&env, "RUNTIME_IMAGES");
    assert_ne!(repinned, pinned);
    assert!(said.contains("runtime python3.13:"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
    untag_all(&registry.host());
}

/// Removes every name of this run's registry from the engine (by tag and by
/// digest, never by image id: the images are the test images under other names).
fn untag_all(host: &str) {
    let filter = format!("reference={host}/*/*");
    for format in ["{{.Repository}}:{{.Tag}}", "{{.Repository}}@{{.Digest}}"] {
        let listed = Command::new("docker")
            .args(["image", "ls", "--filter", &filter, "--format", format])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for name in listed.lines().filter(|l| !l.contains("<none>")) {
            let _ = Command::new("docker").args(["rmi", name]).output();
        }
    }
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sr-pin-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
