#!/bin/sh
# Starts redis-server for script-runner, configured from the environment:
#
#   REDIS_API_PASSWORD, REDIS_WORKER_PASSWORD, REDIS_ADMIN_PASSWORD   (required)
#   REDIS_KEY_PREFIX   the key prefix the api and workers use (default sr)
#   REDIS_MAXMEMORY    memory cap (default 1gb); writes fail beyond it, nothing is evicted
#   REDIS_TLS          on: also serve TLS on 6380 with /tls/redis.crt, /tls/redis.key
#                      (for workers on other hosts)
#   REDIS_TLS_CLIENT_CERTS  on (with REDIS_TLS=on): the TLS port also requires a client
#                      certificate signed by /tls/ca.crt (mutual TLS); the plain port
#                      (the local api and worker, on the internal network) is unchanged
#
# Replication and Sentinel (deploy/redis-sentinel.yml, docs/redis-ha.md), all optional:
#   REDIS_REPLICA_PASSWORD   adds the user `replica` (replication only) and makes this node
#                      log in as it when it replicates (masteruser/masterauth); set it on
#                      every node, since Sentinel may turn any of them into a replica
#   REDIS_SENTINEL_PASSWORD  adds the user `sentinel`, what Sentinel sends to a node
#   REDIS_ANNOUNCE_HOST  the name this node is known by (replica-announce-ip), so Sentinel
#                      names it by that name and not by an address
#   REDIS_REPLICAOF    "HOST PORT": start as a replica of it, unless the sentinels say
#                      otherwise (below)
#   REDIS_SENTINEL_HOSTS  "HOST:PORT ...": asked at start which node is the primary
#                      (SENTINEL GET-MASTER-ADDR-BY-NAME REDIS_SENTINEL_MASTER, default
#                      mymaster); a node the sentinels name is a primary, any other starts
#                      as that one's replica; when none answers, REDIS_REPLICAOF decides
#   REDIS_MIN_REPLICAS_TO_WRITE, REDIS_MIN_REPLICAS_MAX_LAG  (default 0 and 10): as
#                      Redis's min-replicas-to-write/-max-lag (docs/redis-ha.md says when)
#
# `redis-entrypoint.sh sentinel` starts a Redis Sentinel instead (redis-server --sentinel),
# configured from the environment: REDIS_SENTINEL_PASSWORD (required: the `sentinel`
# user's password on the nodes, and the sentinels' own user among themselves),
# REDIS_SENTINEL_CLIENT_PASSWORD (required: the user `client`, which may only ask where
# the primary is: what api, worker and ctl send), REDIS_SENTINEL_MONITOR ("HOST PORT" of
# the first primary), REDIS_SENTINEL_MASTER (mymaster), REDIS_SENTINEL_QUORUM (2),
# REDIS_ANNOUNCE_HOST (this sentinel's name), REDIS_SENTINEL_DOWN_AFTER_MS (5000),
# REDIS_SENTINEL_FAILOVER_TIMEOUT_MS (60000). Sentinel rewrites its own configuration
# (the current primary, the replicas and sentinels it knows, the epoch), so it lives in
# /data/sentinel.conf, written on the first start only; later starts renew only the
# users and passwords in it from the environment.
#
# Users (the `default` user is off, so every client must log in):
#   api     what script-runner-api sends, on keys under the prefix only
#   worker  what script-runner-worker sends, on keys under the prefix only (the local worker)
#   worker-NAME  one per worker host, the same rules as worker, each with its own password:
#           added and removed while Redis runs with `redis-entrypoint.sh worker-host add|remove
#           NAME` (deploy/add-worker.sh --issue/--revoke call it), kept across restarts in
#           /data/worker-hosts.acl (NAME and SHA-256 of the password, one per line)
#   admin   everything: health check, ACL LOG, backups, watching live with redis-cli
#   ops     (only when REDIS_OPS_PASSWORD is set) reads only, under the prefix: what
#           script-runner-ctl needs (+@read +time, and CLIENT SETINFO, which redis-rs
#           sends on connecting: without it every connection adds to ACL LOG)
# Passwords are stored in the ACL file as SHA-256 hashes, never in clear.
#
# Why `default` keeps +@all although it is off: nobody can log in as an `off` user, and
# a connection that has not logged in can send nothing but AUTH/HELLO. But Redis (up to
# at least 8.0) replays the AOF as the default user and re-checks its ACL at every EXEC:
# with `default` at -@all, every MULTI/EXEC block in the AOF (the effects of our Lua
# scripts) would be silently dropped at restart. See redis/redis#14541.
set -eu

hash() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }

# What Sentinel sends to a node (the Redis ACL documentation's list, "ACL rules for Sentinel
# and Replicas"; REPLICAOF beside its old name SLAVEOF), on its hello channel only.
sentinel_node_rules="resetkeys resetchannels &__sentinel__:hello -@all +multi +exec +slaveof +replicaof +ping +subscribe +config|rewrite +role +publish +info +client|setname +client|setinfo +client|kill +script|kill"

# --- sentinel: a Redis Sentinel, its configuration kept in /data ----------------------
# As the redis user throughout (/data is its; root here may not write there).
if [ "${1:-}" = sentinel ] && [ "$(id -u)" = 0 ]; then
    chown redis:redis /data
    exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
fi
if [ "${1:-}" = sentinel ]; then
    : "${REDIS_SENTINEL_PASSWORD:?REDIS_SENTINEL_PASSWORD is not set (see .env)}"
    : "${REDIS_SENTINEL_CLIENT_PASSWORD:?REDIS_SENTINEL_CLIENT_PASSWORD is not set (see .env)}"
    : "${REDIS_SENTINEL_MONITOR:?REDIS_SENTINEL_MONITOR (HOST PORT of the first primary) is not set}"
    master="${REDIS_SENTINEL_MASTER:-mymaster}"
    case "$master" in
    *[!A-Za-z0-9._-]* | "") echo "sentinel: REDIS_SENTINEL_MASTER must be letters, digits, '.', '-', '_'" >&2; exit 1 ;;
    esac
    conf=/data/sentinel.conf
    umask 077
    if [ ! -s "$conf" ]; then
        {
            echo "port 26379"
            echo "bind 0.0.0.0 -::"
            echo "protected-mode no"
            echo "dir /tmp"
            # Names, not addresses: compose's service names here, the hosts' DNS names
            # (the ones in their TLS certificates) across hosts.
            echo "sentinel resolve-hostnames yes"
            echo "sentinel announce-hostnames yes"
            [ -z "${REDIS_ANNOUNCE_HOST:-}" ] || echo "sentinel announce-ip ${REDIS_ANNOUNCE_HOST}"
            echo "sentinel monitor $master ${REDIS_SENTINEL_MONITOR} ${REDIS_SENTINEL_QUORUM:-2}"
            echo "sentinel down-after-milliseconds $master ${REDIS_SENTINEL_DOWN_AFTER_MS:-5000}"
            echo "sentinel failover-timeout $master ${REDIS_SENTINEL_FAILOVER_TIMEOUT_MS:-60000}"
            echo "sentinel parallel-syncs $master 1"
        } >"$conf.new"
        mv "$conf.new" "$conf"
        echo "sentinel: wrote $conf, monitoring $master at ${REDIS_SENTINEL_MONITOR}" >&2
    fi
    # Users and passwords come from the environment on every start (a password changed in
    # .env takes effect at the next start); the rest is Sentinel's own state. Passwords
    # are stored as SHA-256 but for the two Sentinel itself must send.
    grep -v -e '^user ' -e "^sentinel auth-user " -e "^sentinel auth-pass " \
        -e '^sentinel sentinel-user ' -e '^sentinel sentinel-pass ' "$conf" >"$conf.new" || true
    {
        echo "user default off resetpass -@all"
        # The sentinels among themselves, and operators (SENTINEL FAILOVER, SENTINEL SET).
        echo "user sentinel on #$(hash "$REDIS_SENTINEL_PASSWORD") allchannels +@all"
        # api, worker and ctl: where the primary is, nothing that changes anything.
        echo "user client on #$(hash "$REDIS_SENTINEL_CLIENT_PASSWORD") resetchannels -@all +auth +hello +ping +role +command +client|setname +client|setinfo +client|getname +client|id +sentinel|master +sentinel|get-master-addr-by-name +sentinel|replicas +sentinel|sentinels +sentinel|myid"
        echo "sentinel sentinel-user sentinel"
        echo "sentinel sentinel-pass ${REDIS_SENTINEL_PASSWORD}"
        echo "sentinel auth-user $master sentinel"
        echo "sentinel auth-pass $master ${REDIS_SENTINEL_PASSWORD}"
    } >>"$conf.new"
    mv "$conf.new" "$conf"
    exec redis-server "$conf" --sentinel
fi

: "${REDIS_API_PASSWORD:?REDIS_API_PASSWORD is not set (see .env)}"
: "${REDIS_WORKER_PASSWORD:?REDIS_WORKER_PASSWORD is not set (see .env)}"
: "${REDIS_ADMIN_PASSWORD:?REDIS_ADMIN_PASSWORD is not set (see .env)}"
prefix="${REDIS_KEY_PREFIX:-sr}"
case "$prefix" in
*[!A-Za-z0-9._-]* | "") echo "redis: REDIS_KEY_PREFIX must be letters, digits, '.', '-', '_'" >&2; exit 1 ;;
esac

# Sent by redis-rs and deadpool-redis on every connection or pool checkout; INFO is read
# once at start by api and worker, to check that nothing is evicted and AOF is on
# (store/src/redis_setup.rs). It shows no keys and no configuration values. WAIT follows
# a submit, kill, claim or finish with REDIS_MIN_REPLICAS_ACK (store/src/redis_pool.rs).
conn="+ping +unwatch +client|setinfo +info +wait"
# Lua: the scripts are one Redis Functions library, loaded by `admin` only
# (script-runner-ctl redis load-functions, the `functions` service in
# docker-compose.yml); api and worker may call its functions (FCALL) and see whether
# their version is loaded (FUNCTION LIST), never load code: no EVAL, EVALSHA, SCRIPT or
# FUNCTION LOAD/DELETE/FLUSH. The scripts read the clock (TIME). Commands inside the
# scripts are checked too, so each user lists those of its scripts (api: submit, kill,
# key_touch, ws_fork, ws_delete; worker: claim, started, progress, finish, requeue, forget_worker). API keys
# are managed with script-runner-ctl as `admin`, not `api`.
# e2e/tests/redis_acl.rs holds these lists to the scripts' redis.call()s and to the
# commands the api and worker send from Rust, and tries the refused ones against a real
# redis-server; the deploy test checks ACL LOG stays empty.
lua="+time +fcall +function|list"
api_cmds="$conn $lua +multi +exec +xadd +xread +xrevrange +xlen +xpending +hset +hget +hmget +hgetall +hincrby +set +get +mget +smembers +del +expire +pexpire +exists +zadd +zrem +zrange +zrevrange +zcard +zremrangebyscore +zrevrangebyscore +hdel +zrevrank +zscan"
worker_cmds="$conn $lua +multi +exec +discard +xgroup|create +xgroup|delconsumer +xreadgroup +xack +xdel +xadd +xpending +xclaim +hset +hget +hmget +hgetall +hdel +hexists +hincrby +get +set +setex +exists +del +expire +sadd +srem +smembers +zadd +zincrby +zremrangebyscore +zcard +zrange +zremrangebyrank +zscan +zrevrange +zrevrangebyscore +zrevrank"

# The keys a worker reads and writes (docs/redis-keys.md), and nothing else under the
# prefix: not the API keys (sr:apikey:*, sr:apikeys*), so a worker host's password cannot
# mint or read one, nor the api's indexes (sr:tasks, an owner's tasks and active set).
# It reads the index of every workspace (sr:workspaces), which the blob sweep walks, and
# may not write it.
# Commands inside the functions are checked against these too.
worker_keys="~${prefix}:jobs ~${prefix}:task:* ~${prefix}:stats ~${prefix}:stats:* ~${prefix}:worker:* ~${prefix}:workers ~${prefix}:owner:*:cpu ~${prefix}:owner:*:usage ~${prefix}:usage:* ~${prefix}:ws:* %R~${prefix}:workspaces %R~${prefix}:cache:clears"
# A worker's rules, after `user NAME on #SHA256`: the one definition the local worker and
# every worker host's user share (in the ACL file and in ACL SETUSER alike).
worker_rules() { echo "resetkeys $worker_keys resetchannels -@all $worker_cmds"; }
hosts_file=/data/worker-hosts.acl

# --- worker-host add|remove|list NAME: per-host users while Redis runs (as the redis
# user, in the container: `docker compose exec -T -u redis redis redis-entrypoint.sh
# worker-host ...`; /data is redis's, and root there has no DAC_OVERRIDE) ---------------
if [ "${1:-}" = worker-host ]; then
    action="${2:-}" name="${3:-}"
    admin() { REDISCLI_AUTH="$REDIS_ADMIN_PASSWORD" redis-cli --no-auth-warning --user admin -p 6379 "$@"; }
    if [ "$action" = list ]; then
        [ ! -s "$hosts_file" ] || cut -d' ' -f1 "$hosts_file"
        exit 0
    fi
    case "$name" in
    *[!A-Za-z0-9._-]* | "" | -*) echo "redis: worker-host $action NAME: NAME must be letters, digits, '.', '-', '_'" >&2; exit 64 ;;
    esac
    user="worker-$name"
    touch "$hosts_file"
    # One change at a time: the file is rewritten whole.
    exec 9>"$hosts_file.lock"
    flock 9
    # The name compared as a string (awk), never as a pattern: with grep "^$name ", the
    # '.' of w.1 would also match w-1's line and drop it.
    awk -v n="$name" '$1 != n' "$hosts_file" >"$hosts_file.new"
    case "$action" in
    add)
        # The password comes on stdin (never in argv); only its SHA-256 is kept.
        IFS= read -r password || true
        [ "${#password}" -ge 32 ] || { echo "redis: worker-host add: give a password of at least 32 characters on stdin" >&2; exit 64; }
        sum="$(hash "$password")"
        # shellcheck disable=SC2046 # the rules are words
        reply="$(admin ACL SETUSER "$user" reset on "#$sum" $(worker_rules))"
        [ "$reply" = OK ] || { rm -f "$hosts_file.new"; echo "redis: ACL SETUSER $user: $reply" >&2; exit 1; }
        echo "$name $sum" >>"$hosts_file.new"
        ;;
    remove)
        # Out of the file first, so no restart brings it back; ACL DELUSER then closes
        # the user's open connections.
        ;;
    *) rm -f "$hosts_file.new"; echo "redis: worker-host add|remove|list NAME" >&2; exit 64 ;;
    esac
    chmod 600 "$hosts_file.new"
    mv "$hosts_file.new" "$hosts_file"
    if [ "$action" = remove ]; then
        reply="$(admin ACL DELUSER "$user")"
        case "$reply" in
        1) echo "redis: $user removed, its connections closed" >&2 ;;
        0) echo "redis: there was no user $user" >&2 ;;
        *) echo "redis: ACL DELUSER $user: $reply" >&2; exit 1 ;;
        esac
    else
        # A new password for an existing user: SETUSER does not close the connections
        # made with the old one (NOTES.md), so close them here; the host's worker
        # reconnects with the new password, a holder of the old one cannot.
        reply="$(admin CLIENT KILL USER "$user")"
        case "$reply" in
        '' | *[!0-9]*) echo "redis: CLIENT KILL USER $user: $reply" >&2; exit 1 ;;
        esac
        echo "redis: $user added; $reply open connection(s) of it closed" >&2
    fi
    exit 0
fi

mkdir -p /run/redis
umask 077
cat >/run/redis/users.acl <<ACL
user default off resetpass ~* &* +@all
user api on #$(hash "$REDIS_API_PASSWORD") resetkeys ~${prefix}:* resetchannels -@all $api_cmds
user worker on #$(hash "$REDIS_WORKER_PASSWORD") $(worker_rules)
user admin on #$(hash "$REDIS_ADMIN_PASSWORD") ~* &* +@all
ACL
# Read as redis, whose file it is: root here has no capability to read past its mode.
if setpriv --reuid=redis --regid=redis --init-groups test -s "$hosts_file"; then
    setpriv --reuid=redis --regid=redis --init-groups cat "$hosts_file" | while read -r name sum; do
        case "$name:$sum" in
        *[!A-Za-z0-9._:-]* | :* | *:) echo "redis: skipping a malformed line of $hosts_file" >&2; continue ;;
        esac
        echo "user worker-$name on #$sum $(worker_rules)" >>/run/redis/users.acl
    done
fi
if [ -n "${REDIS_OPS_PASSWORD:-}" ]; then
    echo "user ops on #$(hash "$REDIS_OPS_PASSWORD") resetkeys ~${prefix}:* resetchannels -@all +@read +time +ping +client|setinfo" \
        >>/run/redis/users.acl
fi
[ -z "${REDIS_REPLICA_PASSWORD:-}" ] \
    || echo "user replica on #$(hash "$REDIS_REPLICA_PASSWORD") resetkeys resetchannels -@all +psync +replconf +ping" >>/run/redis/users.acl
[ -z "${REDIS_SENTINEL_PASSWORD:-}" ] \
    || echo "user sentinel on #$(hash "$REDIS_SENTINEL_PASSWORD") $sentinel_node_rules" >>/run/redis/users.acl

# Replication: in a configuration file (mode 600 on /run), so the password is not in the
# process's arguments. CONFIG REWRITE (which Sentinel sends after REPLICAOF) writes there.
: >/run/redis/node.conf
if [ -n "${REDIS_REPLICA_PASSWORD:-}" ]; then
    printf 'masteruser replica\nmasterauth %s\n' "$REDIS_REPLICA_PASSWORD" >>/run/redis/node.conf
fi
[ -z "${REDIS_ANNOUNCE_HOST:-}" ] || echo "replica-announce-ip ${REDIS_ANNOUNCE_HOST}" >>/run/redis/node.conf
# Which node is the primary is the sentinels' to say once they run: a node that was
# demoted while it was down comes back as a replica, not as a second primary.
replicaof="${REDIS_REPLICAOF:-}"
if [ -n "${REDIS_SENTINEL_HOSTS:-}" ] && [ -n "${REDIS_SENTINEL_PASSWORD:-}" ]; then
    for s in $(echo "$REDIS_SENTINEL_HOSTS" | tr ',' ' '); do
        answer="$(REDISCLI_AUTH="$REDIS_SENTINEL_PASSWORD" timeout 3 redis-cli --no-auth-warning \
            --user sentinel -h "${s%:*}" -p "${s##*:}" \
            SENTINEL GET-MASTER-ADDR-BY-NAME "${REDIS_SENTINEL_MASTER:-mymaster}" 2>/dev/null | tr '\n' ' ')" || continue
        read -r host port rest <<EOT || true
$answer
EOT
        case "$port" in '' | *[!0-9]*) continue ;; esac
        [ -z "$rest" ] || continue
        if [ "$host" = "${REDIS_ANNOUNCE_HOST:-}" ]; then replicaof=""; else replicaof="$host $port"; fi
        echo "redis: sentinel $s names $host $port the primary" >&2
        break
    done
fi
[ -z "$replicaof" ] || echo "replicaof $replicaof" >>/run/redis/node.conf
echo "min-replicas-to-write ${REDIS_MIN_REPLICAS_TO_WRITE:-0}" >>/run/redis/node.conf
echo "min-replicas-max-lag ${REDIS_MIN_REPLICAS_MAX_LAG:-10}" >>/run/redis/node.conf

set -- redis-server /run/redis/node.conf \
    --bind "0.0.0.0 -::" --port 6379 --protected-mode no \
    --aclfile /run/redis/users.acl \
    --dir /data --appendonly yes --appendfsync everysec \
    --maxmemory "${REDIS_MAXMEMORY:-1gb}" --maxmemory-policy noeviction \
    --acllog-max-len 256 "$@"

if [ "${REDIS_TLS:-off}" = on ]; then
    for f in redis.crt redis.key; do
        [ -r "/tls/$f" ] || { echo "redis: REDIS_TLS=on but /tls/$f is missing (deploy/setup-host.sh --remote-workers makes it)" >&2; exit 1; }
    done
    # The key is readable by root only on the host: hand redis its own copy.
    mkdir -p /run/redis/tls
    cp /tls/redis.crt /tls/redis.key /run/redis/tls/
    set -- "$@" --tls-port 6380 --tls-cert-file /run/redis/tls/redis.crt \
        --tls-key-file /run/redis/tls/redis.key --tls-protocols "TLSv1.2 TLSv1.3"
    if [ -r /tls/ca.crt ]; then
        cp /tls/ca.crt /run/redis/tls/
        set -- "$@" --tls-ca-cert-file /run/redis/tls/ca.crt
    fi
    # tls-auth-clients applies to TLS connections only: the plain port stays as it is.
    case "${REDIS_TLS_CLIENT_CERTS:-off}" in
    on)
        [ -r /tls/ca.crt ] || { echo "redis: REDIS_TLS_CLIENT_CERTS=on but /tls/ca.crt (the CA that signs worker hosts' certificates) is missing" >&2; exit 1; }
        set -- "$@" --tls-auth-clients yes ;;
    off) set -- "$@" --tls-auth-clients no ;;
    *) echo "redis: REDIS_TLS_CLIENT_CERTS must be on or off" >&2; exit 1 ;;
    esac
fi

# /data itself only: what is inside is redis's own (it wrote it), and root holds no
# DAC_READ_SEARCH in compose (cap_drop: ALL) to walk redis's 0700 appendonlydir.
chown -R redis:redis /run/redis
chown redis:redis /data
exec setpriv --reuid=redis --regid=redis --init-groups "$@"
