//! `redis load-functions`, `redis functions`, `redis prune-functions`: this
//! build's Lua functions library in Redis (`store::scripts`), for Redis's
//! admin user (no other user may load or delete code).

use serde::Serialize;
use store::scripts::{self, Loaded};

use crate::{Config, CtlError};

/// One of our libraries in Redis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LibraryView {
    pub name: String,
    /// This build's version.
    pub this_build: bool,
}

pub struct FunctionsAdmin {
    pool: store::redis_pool::Pool,
}

impl FunctionsAdmin {
    pub async fn new(config: &Config) -> Result<FunctionsAdmin, CtlError> {
        Ok(FunctionsAdmin {
            pool: config.pool(1).await?,
        })
    }

    /// Loads this build's library unless Redis has it.
    pub async fn load(&self) -> Result<Loaded, CtlError> {
        let mut conn = self.pool.get().await?;
        Ok(scripts::ensure_loaded(&mut conn).await?)
    }

    /// Every library of ours in Redis, any version.
    pub async fn list(&self) -> Result<Vec<LibraryView>, CtlError> {
        let mut conn = self.pool.get().await?;
        let this = &scripts::library().name;
        Ok(scripts::our_libraries(&mut conn)
            .await?
            .into_iter()
            .map(|name| LibraryView {
                this_build: name == *this,
                name,
            })
            .collect())
    }

    /// Deletes every library of ours but this build's and those in `keep`
    /// (`FUNCTION DELETE`); the names deleted.
    pub async fn prune(&self, keep: &[String]) -> Result<Vec<String>, CtlError> {
        let mut conn = self.pool.get().await?;
        let this = &scripts::library().name;
        let mut deleted = Vec::new();
        for name in scripts::our_libraries(&mut conn).await? {
            if name == *this || keep.contains(&name) {
                continue;
            }
            let () = redis::cmd("FUNCTION")
                .arg("DELETE")
                .arg(&name)
                .query_async(&mut conn)
                .await?;
            deleted.push(name);
        }
        Ok(deleted)
    }
}
