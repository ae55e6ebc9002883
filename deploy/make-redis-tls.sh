#!/usr/bin/env bash
# Makes the TLS material for Redis's port for remote workers: a private CA and a
# certificate for Redis signed by it, with openssl. Keeps what is already there.
#
#   deploy/make-redis-tls.sh DIR NAME[,NAME...]
#   deploy/make-redis-tls.sh --sign-client DIR USER CSR OUT
#
# NAMEs are the DNS names and IPv4 addresses workers use to reach Redis; all go into
# the certificate's subjectAltName (workers check it). Writes DIR/ca.crt (give this to
# worker hosts), DIR/ca.key (keep it here, or offline), DIR/redis.crt, DIR/redis.key.
#
# --sign-client signs a worker host's certificate request CSR (its key stays on that
# host) with DIR's CA as a client certificate (clientAuth only) for subject CN=USER,
# whatever the request asked, and writes it to OUT (deploy/add-worker.sh --issue).
set -euo pipefail

if [[ "${1:-}" == --sign-client ]]; then
    [[ $# == 5 ]] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
    dir="$2" user="$3" csr="$4" out="$5"
    [[ -r "$dir/ca.key" ]] || { echo "make-redis-tls: no CA key in $dir (make the CA first)" >&2; exit 1; }
    openssl req -in "$csr" -noout -verify 2>/dev/null || { echo "make-redis-tls: $csr is not a valid certificate request" >&2; exit 1; }
    openssl x509 -req -in "$csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -CAserial "$dir/ca.srl" -days 825 -subj "/CN=$user" -out "$out" \
        -extfile <(printf '%s\n' "basicConstraints=critical,CA:FALSE" \
            "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth") 2>/dev/null
    chmod 644 "$out"
    echo "make-redis-tls: client certificate for CN=$user in $out" >&2
    exit 0
fi
[[ $# == 2 ]] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
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
