//! Where the blob store is (`WORKSPACE_STORE` and `WORKSPACE_S3_*`): read by the
//! worker, which saves versions there, and by the api, which reads files from it
//! (`read_files`). Declared here once, so both read them alike.

use std::path::{Path, PathBuf};

use shared::envvar::{Var, VarError};
use shared::workspace::StoreLocation;

const WORKSPACE_STORE: Var = Var::new("WORKSPACE_STORE", "");
const WORKSPACE_S3_ENDPOINT: Var = Var::new("WORKSPACE_S3_ENDPOINT", "");
const WORKSPACE_S3_REGION: Var = Var::new("WORKSPACE_S3_REGION", "us-east-1");
const WORKSPACE_S3_ACCESS_KEY_ID: Var = Var::new("WORKSPACE_S3_ACCESS_KEY_ID", "");
const WORKSPACE_S3_SECRET_ACCESS_KEY: Var = Var::new("WORKSPACE_S3_SECRET_ACCESS_KEY", "");
const WORKSPACE_OWNER_MAX_MB: Var = Var::new("WORKSPACE_OWNER_MAX_MB", "10240");

/// The store's variables, and the owner's cap, with their defaults (both
/// binaries read them); docs/configuration.md and `.env.example` are checked
/// against them.
pub const VARS: [Var; 6] = [
    WORKSPACE_STORE,
    WORKSPACE_S3_ENDPOINT,
    WORKSPACE_S3_REGION,
    WORKSPACE_S3_ACCESS_KEY_ID,
    WORKSPACE_S3_SECRET_ACCESS_KEY,
    WORKSPACE_OWNER_MAX_MB,
];

/// `WORKSPACE_OWNER_MAX_MB`, in bytes: the most one owner's workspaces may hold
/// together (0: no cap). The worker holds a new version to it, the api a fork.
pub fn owner_max_bytes(var: &impl Fn(&str) -> Option<String>) -> Result<u64, VarError> {
    Ok(WORKSPACE_OWNER_MAX_MB.range(var, 0, 1 << 30)? << 20)
}

/// What the S3 store needs besides its bucket (`WORKSPACE_S3_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    /// `WORKSPACE_S3_ENDPOINT`: an S3-compatible server's URL (Garage, MinIO,
    /// Ceph, R2); empty: AWS.
    pub endpoint: Option<String>,
    /// `WORKSPACE_S3_REGION`.
    pub region: String,
    /// `WORKSPACE_S3_ACCESS_KEY_ID` and `WORKSPACE_S3_SECRET_ACCESS_KEY`.
    pub access_key_id: String,
    pub secret_access_key: String,
}

/// The blob store's place and credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// `WORKSPACE_STORE`.
    pub location: StoreLocation,
    pub s3: S3Settings,
}

impl StoreConfig {
    /// `WORKSPACE_*`, checked: a store that parses, S3 credentials given
    /// together. An empty `WORKSPACE_STORE` is the directory `default_dir`
    /// (each binary says which: the worker's is under its `TASKS_DIR`).
    pub fn from_lookup(
        var: &impl Fn(&str) -> Option<String>,
        default_dir: &Path,
    ) -> Result<StoreConfig, VarError> {
        let location = match WORKSPACE_STORE.get(var) {
            s if s.trim().is_empty() => {
                let dir: PathBuf =
                    std::path::absolute(default_dir).unwrap_or_else(|_| default_dir.to_owned());
                StoreLocation::Local(dir)
            }
            s => StoreLocation::parse(s.trim())
                .map_err(|e| VarError::new(WORKSPACE_STORE.name, &s, e))?,
        };
        let s3 = S3Settings {
            endpoint: Some(WORKSPACE_S3_ENDPOINT.get(var)).filter(|e| !e.trim().is_empty()),
            region: WORKSPACE_S3_REGION.get(var),
            access_key_id: WORKSPACE_S3_ACCESS_KEY_ID.get(var),
            secret_access_key: WORKSPACE_S3_SECRET_ACCESS_KEY.get(var),
        };
        if matches!(location, StoreLocation::S3 { .. })
            && (s3.access_key_id.is_empty() || s3.secret_access_key.is_empty())
        {
            return Err(VarError::new(
                WORKSPACE_S3_ACCESS_KEY_ID.name,
                "",
                "an access key id, with WORKSPACE_S3_SECRET_ACCESS_KEY, for an s3:// WORKSPACE_STORE",
            ));
        }
        Ok(StoreConfig { location, s3 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(pairs: &[(&str, &str)]) -> Result<StoreConfig, VarError> {
        let var = |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        };
        StoreConfig::from_lookup(&var, Path::new("/data/workspace-store"))
    }

    #[test]
    fn an_empty_store_is_the_default_directory_and_s3_needs_both_keys() {
        let c = load(&[]).expect("defaults load");
        assert_eq!(
            c.location,
            StoreLocation::Local(PathBuf::from("/data/workspace-store"))
        );
        assert_eq!(c.s3.region, "us-east-1");
        let e = load(&[("WORKSPACE_STORE", "s3://b")]).expect_err("no keys");
        assert_eq!(e.name, "WORKSPACE_S3_ACCESS_KEY_ID");
        let c = load(&[
            ("WORKSPACE_STORE", "s3://b/p"),
            ("WORKSPACE_S3_ACCESS_KEY_ID", "k"),
            ("WORKSPACE_S3_SECRET_ACCESS_KEY", "s"),
            ("WORKSPACE_S3_ENDPOINT", " "),
        ])
        .expect("s3 loads");
        assert_eq!(c.s3.endpoint, None);
        let e = load(&[("WORKSPACE_STORE", "ftp://x")]).expect_err("bad store");
        assert_eq!(e.name, "WORKSPACE_STORE");
    }
}
