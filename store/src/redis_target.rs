//! Where a binary's Redis is: one address (`REDIS_URL`), or whichever node
//! Redis Sentinel names primary (`REDIS_SENTINELS`), followed through failovers.
//!
//! With sentinels, a background task asks every sentinel `SENTINEL MASTER
//! <name>` every `REFRESH` and keeps the answer with the highest
//! `config-epoch`: the epoch is what Sentinel's own election raises, so the
//! sentinel that led a failover wins over one that has not heard of it yet.
//! (redis-rs's `SentinelClient` takes the first sentinel that answers and asks
//! the node its `ROLE`; after a failover the old primary still says `master`
//! and takes writes for seconds until the sentinels demote it, and those writes
//! are lost when it resyncs. Here a connection is tied to the primary it was
//! made for, and `is_current` tells a pool to drop it once the sentinels name
//! another; see `redis_pool`, which builds on this module, not the other way.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use shared::envvar::Sentinels;
use tokio::sync::watch;

/// How often the sentinels are asked which node is primary: the longest a
/// process goes on writing to a node after the sentinels stopped naming it.
pub const REFRESH: Duration = Duration::from_millis(250);

/// How long a sentinel may take to answer before the next is trusted.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(1);

/// What a connection is connected to. Cheap to clone.
#[derive(Clone)]
pub struct RedisTarget(Arc<Kind>);

enum Kind {
    /// `REDIS_URL`'s one address.
    Direct(ConnectionInfo),
    Sentinel(Followed),
}

struct Followed {
    master: String,
    /// `REDIS_URL` with its address unused: credentials, TLS, database.
    node: ConnectionInfo,
    sentinels: Vec<ConnectionInfo>,
    primary: watch::Receiver<Option<Primary>>,
}

/// The primary as the sentinels name it, under one failover epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Primary {
    pub host: String,
    pub port: u16,
    pub epoch: u64,
}

impl std::fmt::Display for Primary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} (epoch {})", self.host, self.port, self.epoch)
    }
}

/// What one connection was made to: `None` for a direct target (always current).
pub type Node = Option<Primary>;

impl RedisTarget {
    /// One Redis at `info`: today's single-node set-up.
    pub fn direct(info: ConnectionInfo) -> RedisTarget {
        RedisTarget(Arc::new(Kind::Direct(info)))
    }

    /// One Redis at `url` (tests and tools without sentinels).
    pub fn url(url: &str) -> redis::RedisResult<RedisTarget> {
        Ok(RedisTarget::direct(url.into_connection_info()?))
    }

    /// Follows the primary the sentinels name for `sentinels.master`, reaching it
    /// with `node`'s credentials, TLS and database. Starts the task that asks the
    /// sentinels (it ends when the last clone of the target is dropped); needs a
    /// Tokio runtime.
    pub fn sentinel(node: ConnectionInfo, sentinels: &Sentinels) -> redis::RedisResult<Self> {
        let infos = sentinels
            .addrs
            .iter()
            .map(|a| a.as_str().into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let (tx, rx) = watch::channel(None);
        tokio::spawn(follow(sentinels.master.clone(), infos.clone(), tx));
        Ok(RedisTarget(Arc::new(Kind::Sentinel(Followed {
            master: sentinels.master.clone(),
            node,
            sentinels: infos,
            primary: rx,
        }))))
    }

    /// The primary the sentinels name now (`None`: direct, or not known yet).
    pub fn primary(&self) -> Option<Primary> {
        match &*self.0 {
            Kind::Direct(_) => None,
            Kind::Sentinel(f) => f.primary.borrow().clone(),
        }
    }

    /// Whether a connection made to `node` may still be used: always for a direct
    /// target; with sentinels, while they name the same primary in the same epoch.
    pub fn is_current(&self, node: &Node) -> bool {
        match (&*self.0, node) {
            (Kind::Direct(_), _) => true,
            (Kind::Sentinel(f), Some(made_for)) => f.primary.borrow().as_ref() == Some(made_for),
            (Kind::Sentinel(_), None) => false,
        }
    }

    /// The address to connect to now, and what the connection is tied to.
    pub async fn resolve(&self) -> redis::RedisResult<(ConnectionInfo, Node)> {
        match &*self.0 {
            Kind::Direct(info) => Ok((info.clone(), None)),
            Kind::Sentinel(f) => {
                let mut rx = f.primary.clone();
                // At start the first answer may still be on its way.
                let known =
                    tokio::time::timeout(SENTINEL_TIMEOUT * 2, rx.wait_for(Option::is_some))
                        .await
                        .ok()
                        .and_then(|r| r.ok().and_then(|p| p.clone()));
                let Some(primary) = known else {
                    return Err(no_primary(&f.master));
                };
                let addr = match f.node.addr() {
                    ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => ConnectionAddr::TcpTls {
                        host: primary.host.clone(),
                        port: primary.port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => ConnectionAddr::Tcp(primary.host.clone(), primary.port),
                };
                Ok((f.node.clone().set_addr(addr), Some(primary)))
            }
        }
    }

    /// A new connection to the primary, and what it is tied to.
    pub async fn connect(
        &self,
        config: &AsyncConnectionConfig,
    ) -> redis::RedisResult<(MultiplexedConnection, Node)> {
        let (info, node) = self.resolve().await?;
        let conn = redis::Client::open(info)?
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        Ok((conn, node))
    }

    /// Every host a task must not reach: `REDIS_URL`'s; with sentinels, the
    /// sentinels (those listed and those they know) and every node they know
    /// (the primary and its replicas, any of which may be promoted), as
    /// `(host, port)`. An error if no sentinel
    /// answered: the nodes would be left reachable.
    pub async fn hosts(&self) -> redis::RedisResult<Vec<(String, u16)>> {
        let f = match &*self.0 {
            Kind::Direct(info) => return Ok(addr_host(info.addr()).into_iter().collect()),
            Kind::Sentinel(f) => f,
        };
        let mut hosts: Vec<(String, u16)> = f
            .sentinels
            .iter()
            .filter_map(|s| addr_host(s.addr()))
            .collect();
        let mut answered = false;
        for s in &f.sentinels {
            let Ok(mut conn) = sentinel_connection(s).await else {
                continue;
            };
            let Ok(Some(primary)) = ask(&mut conn, &f.master).await else {
                continue;
            };
            answered = true;
            hosts.push((primary.host, primary.port));
            let replicas: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(&f.master)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            let others: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                .arg("SENTINELS")
                .arg(&f.master)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            for r in replicas.into_iter().chain(others) {
                if let (Some(ip), Some(port)) =
                    (r.get("ip"), r.get("port").and_then(|p| p.parse().ok()))
                {
                    hosts.push((ip.clone(), port));
                }
            }
        }
        if !answered {
            return Err(no_primary(&f.master));
        }
        hosts.sort();
        hosts.dedup();
        Ok(hosts)
    }
}

fn addr_host(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}

fn no_primary(master: &str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        format!(
            "no sentinel named a primary for {master:?} (REDIS_SENTINELS, REDIS_SENTINEL_MASTER)"
        ),
    ))
}

async fn sentinel_connection(info: &ConnectionInfo) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(SENTINEL_TIMEOUT))
        .set_response_timeout(Some(SENTINEL_TIMEOUT));
    redis::Client::open(info.clone())?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// One sentinel's view of `master`: its address and epoch, in one round trip.
///
/// The address is `GET-MASTER-ADDR-BY-NAME`'s, not `SENTINEL MASTER`'s: while
/// the sentinel that won the election reconfigures the replicas, it already
/// names the promoted replica there, whereas `SENTINEL MASTER` still shows the
/// old address beside the new epoch (seen on 7.0.15), which would send writes
/// to the old primary under the new epoch.
async fn ask(
    conn: &mut MultiplexedConnection,
    master: &str,
) -> redis::RedisResult<Option<Primary>> {
    let (fields, addr): (HashMap<String, String>, Option<(String, String)>) = redis::pipe()
        .cmd("SENTINEL")
        .arg("MASTER")
        .arg(master)
        .cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(master)
        .query_async(conn)
        .await?;
    Ok(parse_master(&fields, addr.as_ref()))
}

/// A sentinel's answers as a `Primary`: the epoch of `SENTINEL MASTER`'s
/// reply, the address of `GET-MASTER-ADDR-BY-NAME`'s (`None` if either lacks it).
pub fn parse_master(
    fields: &HashMap<String, String>,
    addr: Option<&(String, String)>,
) -> Option<Primary> {
    let (host, port) = addr?;
    Some(Primary {
        host: host.clone(),
        port: port.parse().ok()?,
        epoch: fields.get("config-epoch")?.parse().ok()?,
    })
}

/// Of the sentinels' answers, the one of the latest failover epoch.
pub fn latest(answers: impl IntoIterator<Item = Primary>) -> Option<Primary> {
    answers.into_iter().max_by_key(|p| p.epoch)
}

/// The primary to follow after a round in which `asked` sentinels gave
/// `answers`, `current` being the one followed. Never back to an older epoch
/// because the one sentinel that knows the newer did not answer this round
/// (right after a failover only the elected one does): an older epoch is
/// taken only when every sentinel answered and all agree (their
/// configuration was reset).
pub fn choose(current: Option<&Primary>, answers: &[Primary], asked: usize) -> Option<Primary> {
    let newest = latest(answers.iter().cloned())?;
    match current {
        Some(c) if newest.epoch < c.epoch => {
            let unanimous = answers.len() == asked && answers.iter().all(|a| *a == newest);
            unanimous.then_some(newest)
        }
        _ => Some(newest),
    }
}

/// Asks the sentinels every `REFRESH` until every receiver is gone, publishing
/// the latest primary whenever it changes. A round with no answer keeps the
/// last one: the sentinels being unreachable says nothing about the primary.
async fn follow(
    master: String,
    sentinels: Vec<ConnectionInfo>,
    tx: watch::Sender<Option<Primary>>,
) {
    let mut conns: Vec<Option<MultiplexedConnection>> = vec![None; sentinels.len()];
    let mut silent_logged = false;
    loop {
        let rounds = conns.iter_mut().zip(&sentinels).map(|(slot, info)| {
            let master = master.as_str();
            async move {
                if slot.is_none() {
                    *slot = sentinel_connection(info).await.ok();
                }
                let conn = slot.as_mut()?;
                match ask(conn, master).await {
                    Ok(answer) => answer,
                    Err(e) if crate::redis_error::breaks_connection(&e) => {
                        tracing::debug!(error = %e, "a sentinel did not answer");
                        *slot = None;
                        None
                    }
                    // An error reply (no such master, a refused command): the
                    // connection is fine, the question is not.
                    Err(e) => {
                        tracing::debug!(error = %e, "a sentinel refused the question");
                        None
                    }
                }
            }
        });
        let answers: Vec<Primary> = futures_util::future::join_all(rounds)
            .await
            .into_iter()
            .flatten()
            .collect();
        if answers.is_empty() {
            if !silent_logged {
                silent_logged = true;
                tracing::warn!(
                    master = %master,
                    "no sentinel named a primary for this name (unreachable, or \
                     REDIS_SENTINEL_MASTER wrong); keeping the last primary known"
                );
            }
        } else {
            silent_logged = false;
        }
        tx.send_if_modified(|current| {
            let Some(primary) = choose(current.as_ref(), &answers, sentinels.len()) else {
                return false;
            };
            if current.as_ref() == Some(&primary) {
                return false;
            }
            tracing::info!(master = %master, primary = %primary, "the sentinels name the primary");
            *current = Some(primary);
            true
        });
        tokio::select! {
            () = tokio::time::sleep(REFRESH) => {}
            () = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(host: &str, epoch: u64) -> Primary {
        Primary {
            host: host.into(),
            port: 6379,
            epoch,
        }
    }

    #[test]
    fn an_older_epoch_is_never_followed_unless_every_sentinel_says_so() {
        let new = p("b", 2);
        // The elected sentinel missed a round: the others still say epoch 1.
        assert_eq!(choose(Some(&new), &[p("a", 1), p("a", 1)], 3), None);
        assert_eq!(
            choose(Some(&new), &[p("a", 1), p("a", 1), p("c", 1)], 3),
            None
        );
        // All three reset to epoch 1 and agree.
        assert_eq!(
            choose(Some(&new), &[p("a", 1), p("a", 1), p("a", 1)], 3),
            Some(p("a", 1))
        );
        assert_eq!(
            choose(Some(&p("a", 1)), &[p("a", 1), new.clone()], 3),
            Some(new)
        );
        assert_eq!(choose(None, &[p("a", 0)], 3), Some(p("a", 0)));
        assert_eq!(choose(Some(&p("a", 0)), &[], 3), None);
    }

    #[test]
    fn the_latest_epoch_wins_whatever_the_order() {
        assert_eq!(latest([p("a", 1), p("b", 2), p("a", 1)]), Some(p("b", 2)));
        assert_eq!(latest([p("b", 2), p("a", 1)]), Some(p("b", 2)));
        assert_eq!(latest([]), None);
    }

    #[test]
    fn the_address_comes_from_get_master_addr_and_the_epoch_from_master() {
        // Mid-failover: MASTER still shows the old address, the new epoch.
        let mut f: HashMap<String, String> =
            [("ip", "10.0.0.1"), ("port", "6379"), ("config-epoch", "3")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        let promoted = ("10.0.0.2".to_owned(), "6380".to_owned());
        assert_eq!(
            parse_master(&f, Some(&promoted)),
            Some(Primary {
                host: "10.0.0.2".into(),
                port: 6380,
                epoch: 3
            })
        );
        assert_eq!(parse_master(&f, None), None);
        f.remove("config-epoch");
        assert_eq!(parse_master(&f, Some(&promoted)), None);
    }
}
