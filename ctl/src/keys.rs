//! `script-runner-ctl keys`: create, list, revoke and rotate API keys. The only
//! commands of the ctl that write, each one Lua script (`shared::scripts`:
//! `key_create`, `key_rotate`, `key_revoke`). A new key is printed once; Redis
//! holds only its SHA-256.

use serde::Serialize;
use shared::apikey::{ApiKeyRecord, Limits, Scopes};
use shared::egress::AllowList;
use shared::options::Networks;
use shared::time::rfc3339_ms;
use store::apikeys::{self, NewKey};

use crate::{Config, CtlError};

/// A key as `keys list --json` shows it: never the key, never its hash.
#[derive(Debug, Serialize)]
pub struct KeyView {
    pub name: String,
    pub scopes: Vec<&'static str>,
    pub max_queued: Option<u64>,
    pub max_running: Option<u64>,
    pub cpu_seconds_per_day: Option<u64>,
    /// The egress policies its tasks may ask for (all three when not limited).
    pub networks: Vec<&'static str>,
    /// The hosts its allow-list tasks may name at most; `null`: any.
    pub allow_hosts: Option<Vec<String>>,
    pub created_at: Option<String>,
    pub last_used_at: Option<String>,
}

impl From<ApiKeyRecord> for KeyView {
    fn from(r: ApiKeyRecord) -> KeyView {
        KeyView {
            name: r.name,
            scopes: r.scopes.iter().map(|s| s.as_str()).collect(),
            max_queued: r.limits.max_queued,
            max_running: r.limits.max_running,
            cpu_seconds_per_day: r.limits.cpu_seconds_per_day,
            networks: r
                .limits
                .networks
                .unwrap_or(Networks::ALL)
                .iter()
                .map(|n| n.as_str())
                .collect(),
            allow_hosts: r
                .allow_hosts
                .map(|l| l.entries().iter().map(ToString::to_string).collect()),
            created_at: r.created_at.map(rfc3339_ms),
            last_used_at: r.last_used_at.map(rfc3339_ms),
        }
    }
}

/// What `keys create` and `keys rotate` print with `--json`.
#[derive(Serialize)]
pub struct IssuedKey<'a> {
    pub name: &'a str,
    pub key: &'a str,
    pub scopes: Vec<&'static str>,
}

/// The ctl's handle on the key store.
pub struct KeyAdmin {
    pool: store::redis_pool::Pool,
    keys: shared::Keys,
}

impl KeyAdmin {
    pub async fn new(config: &Config) -> Result<KeyAdmin, CtlError> {
        Ok(KeyAdmin {
            pool: config.pool(1).await?,
            keys: config.keys.clone(),
        })
    }

    pub async fn create(
        &self,
        name: &str,
        scopes: Scopes,
        limits: Limits,
        allow_hosts: Option<AllowList>,
    ) -> Result<NewKey, CtlError> {
        let record = ApiKeyRecord {
            name: name.to_owned(),
            scopes,
            limits,
            allow_hosts,
            created_at: None,
            last_used_at: None,
        };
        let mut conn = self.pool.get().await?;
        Ok(apikeys::create(&mut conn, &self.keys, &record).await?)
    }

    /// The new key; the key's record (scopes, limits) for printing.
    pub async fn rotate(&self, name: &str) -> Result<(NewKey, Scopes), CtlError> {
        let mut conn = self.pool.get().await?;
        let key = apikeys::rotate(&mut conn, &self.keys, name).await?;
        let scopes = apikeys::list(&mut conn, &self.keys)
            .await?
            .into_iter()
            .find(|r| r.name == name)
            .map_or(Scopes::NONE, |r| r.scopes);
        Ok((key, scopes))
    }

    pub async fn revoke(&self, name: &str) -> Result<(), CtlError> {
        let mut conn = self.pool.get().await?;
        Ok(apikeys::revoke(&mut conn, &self.keys, name).await?)
    }

    pub async fn list(&self) -> Result<Vec<KeyView>, CtlError> {
        let mut conn = self.pool.get().await?;
        Ok(apikeys::list(&mut conn, &self.keys)
            .await?
            .into_iter()
            .map(KeyView::from)
            .collect())
    }
}

/// `keys list` as text: one line per key.
pub fn render_list(keys: &[KeyView]) -> String {
    if keys.is_empty() {
        return "no API keys (create one with `script-runner-ctl keys create --name NAME`)\n"
            .to_owned();
    }
    let opt = |n: Option<u64>| n.map_or("-".to_owned(), |n| n.to_string());
    let mut out = format!(
        "{:<24} {:<15} {:>10} {:>11} {:>12} {:<20} {:<24} {:<24} {}\n",
        "NAME",
        "SCOPES",
        "MAX_QUEUED",
        "MAX_RUNNING",
        "CPU_S/DAY",
        "NETWORKS",
        "CREATED",
        "LAST_USED",
        "ALLOW_HOSTS"
    );
    for k in keys {
        out.push_str(&format!(
            "{:<24} {:<15} {:>10} {:>11} {:>12} {:<20} {:<24} {:<24} {}\n",
            k.name,
            k.scopes.join(","),
            opt(k.max_queued),
            opt(k.max_running),
            opt(k.cpu_seconds_per_day),
            k.networks.join(","),
            k.created_at.as_deref().unwrap_or("-"),
            k.last_used_at.as_deref().unwrap_or("never"),
            k.allow_hosts
                .as_ref()
                .map_or("any".to_owned(), |h| h.join(",")),
        ));
    }
    out
}
