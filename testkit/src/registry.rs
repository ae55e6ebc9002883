//! A real image registry (Debian's `docker-registry`, the CNCF Distribution
//! server) on a free loopback port, storing in a directory of its own: what a
//! test needs to push an image, move a tag and pull by digest on a machine that
//! reaches no public registry. Docker talks plain HTTP to registries on
//! 127.0.0.0/8 without any daemon setting.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_until};

pub struct Registry {
    child: Child,
    pub port: u16,
    dir: std::path::PathBuf,
}

impl Registry {
    /// Starts one and waits until its API answers.
    pub async fn start() -> Registry {
        let dir =
            std::env::temp_dir().join(format!("sr-registry-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("registry dir");
        let port = free_port();
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("data").display()
            ),
        )
        .expect("registry config");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry must be installed (scripts/test.sh installs it)");
        let registry = Registry { child, port, dir };
        let url = format!("http://127.0.0.1:{port}/v2/");
        wait_until("the registry to answer", Duration::from_secs(20), || {
            let url = url.clone();
            async move {
                let r = reqwest::get(&url).await.ok()?;
                r.status().is_success().then_some(())
            }
        })
        .await;
        registry
    }

    /// `127.0.0.1:PORT`, the start of every image name pushed here.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
