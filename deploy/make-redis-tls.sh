#!/usr/bin/env bash
# Makes the TLS material for Redis's port for remote workers: a private CA and a
# certificate for Redis signed by it, with openssl. Keeps what is already there.
#
#   deploy/make-redis-tls.sh DIR NAME[,NAME...]
#
# NAMEs are the DNS names and IPv4 addresses workers use to reach Redis; all go into
# the certificate's subjectAltName (workers check it). Writes DIR/ca.crt (give this to
# worker hosts), DIR/ca.key (keep it here, or offline), DIR/redis.crt, DIR/redis.key.
set -euo pipefail

[[ $# == 2 ]] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
dir="$1" san=""
IFS=',' read -ra names <<<"$2"
for n in "${names[@]}"; do
    [[ -n "$n" ]] || continue
    if [[ "$n" =~ ^[0-9.]+$ ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
san="${san%,}"
[[ -n "$san" ]] || { echo "make-redis-tls: no name given" >&2; exit 64; }

if [[ -s "$dir/redis.crt" && -s "$dir/ca.crt" ]]; then
    echo "make-redis-tls: $dir already holds a certificate (delete it to make a new one)" >&2
    exit 0
fi
install -d -m 700 "$dir"
umask 077
openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -days 3650 \
    -subj "/CN=script-runner Redis CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
    -subj "/CN=${names[0]}" -keyout "$dir/redis.key" -out "$dir/redis.csr" 2>/dev/null
openssl x509 -req -in "$dir/redis.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 825 -out "$dir/redis.crt" -extfile <(printf '%s\n' "subjectAltName=$san" \
        "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
        "extendedKeyUsage=serverAuth") 2>/dev/null
rm -f "$dir/redis.csr" "$dir/ca.srl"
chmod 644 "$dir/ca.crt" "$dir/redis.crt"
echo "make-redis-tls: CA and Redis certificate for $san in $dir" >&2
