#!/bin/sh
# Starts script-runner-worker inside its container (host network, NET_ADMIN, Docker socket).
#
# The worker's firewall rules must land in the same iptables backend the host's Docker
# uses (its DOCKER-USER chain). This image defaults to nftables; a host whose Docker
# still uses the legacy backend gets the legacy tools instead.
set -eu
if ! iptables-nft -w -n -L DOCKER-USER >/dev/null 2>&1 \
    && iptables-legacy -w -n -L DOCKER-USER >/dev/null 2>&1; then
    for tool in iptables iptables-restore iptables-save; do
        update-alternatives --quiet --set "$tool" "/usr/sbin/$tool-legacy" 2>/dev/null \
            || ln -sf "/usr/sbin/xtables-legacy-multi" "/usr/local/sbin/$tool"
    done
    echo "worker-entrypoint: the host's Docker uses legacy iptables; using it too" >&2
fi
exec /usr/local/bin/script-runner-worker "$@"
