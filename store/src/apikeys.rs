//! API keys in Redis: made and managed by `script-runner-ctl keys`, looked up
//! by the api on every request. What is stored and why: `shared::apikey` and
//! docs/security.md. Only the SHA-256 of a key reaches Redis; the key itself
//! exists only in the ctl's output and the client's configuration.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use redis::aio::ConnectionLike;
use shared::Keys;
use shared::apikey::{ApiKeyRecord, KEY_PREFIX, KeyError, LAST_USED_INTERVAL_MS, key_hash};
use shared::scripts::{KeyCreated, ScriptCall};

use crate::scripts;

/// A new key, in clear: shown once and never stored. `Debug` does not show it.
pub struct NewKey(String);

impl NewKey {
    /// The key's text, to print once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its SHA-256, hex: what Redis holds.
    pub fn hash(&self) -> String {
        key_hash(self.0.as_bytes())
    }
}

impl fmt::Debug for NewKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NewKey(..)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("the operating system gave no random bytes: {0}")]
    Random(String),
    #[error("Redis failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("the {script} script replied {reply}, which this version does not know")]
    Reply { script: &'static str, reply: String },
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("a key named {0:?} exists already: rotate it (`keys rotate {0}`) or pick another name")]
    NameTaken(String),
    #[error(
        "a key named {0:?} was revoked, and a revoked key's name is not reused: its tasks keep it \
         as their owner; choose another name"
    )]
    NameRevoked(String),
    #[error("no key named {0:?} (see `keys list`)")]
    NoSuchKey(String),
}

impl From<scripts::InvokeError> for ApiKeyError {
    fn from(e: scripts::InvokeError) -> ApiKeyError {
        match e {
            scripts::InvokeError::Redis(e) => ApiKeyError::Redis(e),
            scripts::InvokeError::Reply { script, reply } => ApiKeyError::Reply { script, reply },
        }
    }
}

/// `srk_` and 32 bytes from the OS's randomness, base64url without padding.
pub fn generate() -> Result<NewKey, ApiKeyError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ApiKeyError::Random(e.to_string()))?;
    Ok(NewKey(format!(
        "{KEY_PREFIX}{}",
        URL_SAFE_NO_PAD.encode(bytes)
    )))
}

/// Records a new key for `record` (its name checked) and returns it, once.
pub async fn create(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    record: &ApiKeyRecord,
) -> Result<NewKey, ApiKeyError> {
    shared::apikey::check_name(&record.name)?;
    let key = generate()?;
    let call = ScriptCall::key_create(keys, &record.name, &key.hash(), &record.to_fields());
    match scripts::invoke(conn, &call).await? {
        KeyCreated::Created => Ok(key),
        KeyCreated::NameRevoked => Err(ApiKeyError::NameRevoked(record.name.clone())),
        KeyCreated::NameTaken => Err(ApiKeyError::NameTaken(record.name.clone())),
    }
}

/// A new key for the key named `name`; the old one stops working at once.
pub async fn rotate(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    name: &str,
) -> Result<NewKey, ApiKeyError> {
    shared::apikey::check_name(name)?;
    let key = generate()?;
    let call = ScriptCall::key_rotate(keys, name, &key.hash());
    if scripts::invoke(conn, &call).await? {
        Ok(key)
    } else {
        Err(ApiKeyError::NoSuchKey(name.to_owned()))
    }
}

/// Deletes the key named `name`.
pub async fn revoke(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    name: &str,
) -> Result<(), ApiKeyError> {
    shared::apikey::check_name(name)?;
    if scripts::invoke(conn, &ScriptCall::key_revoke(keys, name)).await? {
        Ok(())
    } else {
        Err(ApiKeyError::NoSuchKey(name.to_owned()))
    }
}

/// Every key's record, by name. A name whose record is gone is left out.
pub async fn list(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
) -> Result<Vec<ApiKeyRecord>, ApiKeyError> {
    let names: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.api_key_names())
        .query_async(conn)
        .await?;
    let mut out = Vec::with_capacity(names.len());
    for (_, hash) in names {
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(keys.api_key(&hash))
            .query_async(conn)
            .await?;
        if let Some(r) = ApiKeyRecord::from_hash(fields)? {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The record of the key presented (in clear; hashed here), and Redis's clock;
/// `None` for no such key (never made, revoked or rotated away). Sets
/// `last_used_at` if it is older than `LAST_USED_INTERVAL_MS`, so a key in use
/// costs one write a minute.
pub async fn lookup(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    presented: &[u8],
) -> Result<Option<ApiKeyRecord>, ApiKeyError> {
    let hash = key_hash(presented);
    let (fields, time): (Vec<(String, String)>, (i64, i64)) = redis::pipe()
        .cmd("HGETALL")
        .arg(keys.api_key(&hash))
        .cmd("TIME")
        .query_async(conn)
        .await?;
    let Some(record) = ApiKeyRecord::from_hash(fields)? else {
        return Ok(None);
    };
    let now = shared::time::redis_time_ms(time);
    let stale = record
        .last_used_at
        .is_none_or(|last| now - last >= LAST_USED_INTERVAL_MS as i64);
    if stale {
        let call = ScriptCall::key_touch(keys, &hash, LAST_USED_INTERVAL_MS);
        let _touched = scripts::invoke(conn, &call).await?;
    }
    Ok(Some(record))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_prefixed_256_bit_base64url() {
        let k = generate()
            .map(|k| k.expose().to_owned())
            .unwrap_or_default();
        let body = k.strip_prefix(KEY_PREFIX).unwrap_or_default();
        assert_eq!(body.len(), 43, "{k}");
        assert!(
            body.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        let other = generate()
            .map(|k| k.expose().to_owned())
            .unwrap_or_default();
        assert_ne!(k, other);
        assert_eq!(format!("{:?}", generate().ok()), "Some(NewKey(..))");
    }
}
