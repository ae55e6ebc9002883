#!/bin/sh
# Starts redis-server for script-runner, configured from the environment:
#
#   REDIS_API_PASSWORD, REDIS_WORKER_PASSWORD, REDIS_ADMIN_PASSWORD   (required)
#   REDIS_KEY_PREFIX   the key prefix the api and workers use (default sr)
#   REDIS_MAXMEMORY    memory cap (default 1gb); writes fail beyond it, nothing is evicted
#   REDIS_TLS          on: also serve TLS on 6380 with /tls/redis.crt, /tls/redis.key
#                      (for workers on other hosts; clients need no certificate)
#
# Users (the `default` user is off, so every client must log in):
#   api     what script-runner-api sends, on keys under the prefix only
#   worker  what script-runner-worker sends, on keys under the prefix only
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

: "${REDIS_API_PASSWORD:?REDIS_API_PASSWORD is not set (see .env)}"
: "${REDIS_WORKER_PASSWORD:?REDIS_WORKER_PASSWORD is not set (see .env)}"
: "${REDIS_ADMIN_PASSWORD:?REDIS_ADMIN_PASSWORD is not set (see .env)}"
prefix="${REDIS_KEY_PREFIX:-sr}"
case "$prefix" in
*[!A-Za-z0-9._-]* | "") echo "redis: REDIS_KEY_PREFIX must be letters, digits, '.', '-', '_'" >&2; exit 1 ;;
esac

hash() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }

# Sent by redis-rs and deadpool-redis on every connection or pool checkout; INFO is read
# once at start by api and worker, to check that nothing is evicted and AOF is on
# (support/src/redis_setup.rs). It shows no keys and no configuration values.
conn="+ping +unwatch +client|setinfo +info"
# Lua: scripts read the clock (TIME); EVALSHA with SCRIPT LOAD on a cache miss (what
# redis-rs's Script does). Not +@scripting, which includes SCRIPT FLUSH and FUNCTION.
# Commands inside the scripts are checked too, so each user lists those of its scripts
# (api: submit, kill; worker: claim, started, progress, finish, requeue, forget_worker).
lua="+time +evalsha +script|load"
api_cmds="$conn $lua +xadd +xlen +xpending +hset +hget +hmget +hgetall +hincrby +set +get +mget +smembers +del +expire +zadd +zrem +zremrangebyscore +zrevrangebyscore"
worker_cmds="$conn $lua +multi +exec +discard +xgroup|create +xgroup|delconsumer +xreadgroup +xack +xdel +xadd +xpending +xclaim +hset +hget +hmget +hgetall +hdel +hincrby +get +set +setex +exists +del +expire +sadd +srem +smembers"

mkdir -p /run/redis
umask 077
cat >/run/redis/users.acl <<ACL
user default off resetpass ~* &* +@all
user api on #$(hash "$REDIS_API_PASSWORD") resetkeys ~${prefix}:* resetchannels -@all $api_cmds
user worker on #$(hash "$REDIS_WORKER_PASSWORD") resetkeys ~${prefix}:* resetchannels -@all $worker_cmds
user admin on #$(hash "$REDIS_ADMIN_PASSWORD") ~* &* +@all
ACL
if [ -n "${REDIS_OPS_PASSWORD:-}" ]; then
    echo "user ops on #$(hash "$REDIS_OPS_PASSWORD") resetkeys ~${prefix}:* resetchannels -@all +@read +time +ping +client|setinfo" \
        >>/run/redis/users.acl
fi

set -- redis-server \
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
        --tls-key-file /run/redis/tls/redis.key --tls-auth-clients no \
        --tls-protocols "TLSv1.2 TLSv1.3"
    if [ -r /tls/ca.crt ]; then
        cp /tls/ca.crt /run/redis/tls/
        set -- "$@" --tls-ca-cert-file /run/redis/tls/ca.crt
    fi
fi

chown -R redis:redis /run/redis /data
exec setpriv --reuid=redis --regid=redis --init-groups "$@"
