//! A throwaway Garage (a self-hosted S3 server, the `garage` binary that
//! scripts/test.sh installs with `cargo install garage`) per test: one node on
//! free ports, its layout applied, one bucket and one key allowed on it. The
//! workspace tests store versions in it as a fleet would, over S3.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::{free_port, wait_until};

/// A running Garage node with a bucket and a key.
pub struct Garage {
    child: Child,
    dir: PathBuf,
    config: PathBuf,
    /// `http://127.0.0.1:<port>`: its S3 API.
    pub endpoint: String,
    pub bucket: String,
    pub access_key_id: String,
    pub secret_access_key: String,
}

/// The region Garage answers as.
pub const GARAGE_REGION: &str = "garage";

/// The binary: `GARAGE_BIN`, else `garage` on PATH, else cargo's bin directory.
fn binary() -> PathBuf {
    if let Ok(bin) = std::env::var("GARAGE_BIN") {
        return bin.into();
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("garage"))
            .find(|p| p.is_file())
    });
    on_path.unwrap_or_else(|| {
        let home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
            .unwrap_or_default();
        home.join("bin").join("garage")
    })
}

impl Garage {
    pub async fn start() -> Garage {
        let dir = std::env::temp_dir().join(format!("sr-garage-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(dir.join("meta")).expect("garage dir");
        std::fs::create_dir_all(dir.join("data")).expect("garage dir");
        let (s3, rpc) = (free_port(), free_port());
        let secret: String = (0..32).map(|_| format!("{:02x}", rand_byte())).collect();
        let config = dir.join("garage.toml");
        std::fs::write(
            &config,
            format!(
                "metadata_dir = \"{meta}\"\n\
                 data_dir = \"{data}\"\n\
                 db_engine = \"sqlite\"\n\
                 replication_factor = 1\n\
                 rpc_bind_addr = \"127.0.0.1:{rpc}\"\n\
                 rpc_public_addr = \"127.0.0.1:{rpc}\"\n\
                 rpc_secret = \"{secret}\"\n\
                 [s3_api]\n\
                 s3_region = \"{GARAGE_REGION}\"\n\
                 api_bind_addr = \"127.0.0.1:{s3}\"\n",
                meta = dir.join("meta").display(),
                data = dir.join("data").display(),
            ),
        )
        .expect("garage config");
        let child = Command::new(binary())
            .arg("-c")
            .arg(&config)
            .arg("server")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("garage.log")).expect("garage log"))
            .spawn()
            .expect("garage must be installed (scripts/test.sh runs `cargo install garage`)");
        let mut g = Garage {
            child,
            dir,
            config,
            endpoint: format!("http://127.0.0.1:{s3}"),
            bucket: "workspaces".into(),
            access_key_id: String::new(),
            secret_access_key: String::new(),
        };
        let id = wait_until(
            "garage to report its node id",
            Duration::from_secs(30),
            || {
                let out = g.cli(&["node", "id", "-q"]);
                async move {
                    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                    (out.status.success() && !text.is_empty())
                        .then(|| text.split('@').next().unwrap_or("").to_owned())
                }
            },
        )
        .await;
        // `node id` reads the node's key from disk, before the server listens for
        // RPC: the layout is assigned once the server takes it.
        wait_until("garage to take its layout", Duration::from_secs(30), || {
            let out = g.cli(&["layout", "assign", "-z", "dc1", "-c", "1G", &id]);
            async move { out.status.success().then_some(()) }
        })
        .await;
        g.ok(&["layout", "apply", "--version", "1"]);
        g.ok(&["bucket", "create", "workspaces"]);
        let key = g.ok(&["key", "create", "script-runner"]);
        g.access_key_id = field(&key, "Key ID");
        g.secret_access_key = field(&key, "Secret key");
        g.ok(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            "workspaces",
            "--key",
            "script-runner",
        ]);
        g
    }

    /// The worker's variables for this store.
    pub fn worker_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("WORKSPACE_STORE", format!("s3://{}/sr", self.bucket)),
            ("WORKSPACE_S3_ENDPOINT", self.endpoint.clone()),
            ("WORKSPACE_S3_REGION", GARAGE_REGION.to_owned()),
            ("WORKSPACE_S3_ACCESS_KEY_ID", self.access_key_id.clone()),
            (
                "WORKSPACE_S3_SECRET_ACCESS_KEY",
                self.secret_access_key.clone(),
            ),
        ]
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(binary())
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .output()
            .expect("garage cli")
    }

    /// Runs a `garage` command that must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "garage {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The value after `name:` on a line of Garage's output.
fn field(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(name)?.trim_start().strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no {name:?} in garage's output:\n{text}"))
}

fn rand_byte() -> u8 {
    uuid::Uuid::new_v4().as_bytes()[0]
}

impl Drop for Garage {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
