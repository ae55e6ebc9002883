# Images for script-runner: `--target api`, `--target worker`, `--target redis`,
# `--target caddy`. docker-compose.yml builds all four: `docker compose up -d --build`.
#
# Every base image is a build argument, so a machine without a registry can build from
# locally imported images (see deploy/build-base-image.sh) tagged with these names.
#
# Where the Rust binaries come from (BINARIES):
#   build     (default) compiled here, in a Rust toolchain image (RUST_IMAGE). A real host
#             needs nothing but Docker and a registry; the build is reproducible (--locked).
#   prebuilt  copied from PREBUILT_DIR in the build context (target/release by default), as
#             built by `cargo build --release` on the host. For machines that cannot pull
#             a Rust image (like CI here) or that already built the binaries for tests.
# BuildKit (Compose v2's default builder) builds only the stages the target needs, so
# the unused source is never pulled.
ARG BASE_IMAGE=debian:trixie-slim
ARG RUST_IMAGE=rust:1.95-slim-trixie
ARG BINARIES=build

# --- binaries -----------------------------------------------------------------------
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Every workspace member (Cargo.toml's `members`) must be here, or the build fails.
COPY api api
COPY worker worker
COPY shared shared
COPY store store
COPY blobs blobs
COPY ctl ctl
# Test-only members: cargo loads the whole workspace, so they must be present.
COPY testkit testkit
COPY e2e e2e
# BuildKit cache mounts keep the crate registry (CARGO_HOME is /usr/local/cargo in the
# official rust images) and the target directory between builds, so a deploy
# recompiles only what changed.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p script-runner-api -p script-runner-worker -p script-runner-ctl \
    && mkdir /out \
    && cp target/release/script-runner-api target/release/script-runner-worker \
        target/release/script-runner-ctl /out/

FROM ${BASE_IMAGE} AS prebuilt
ARG PREBUILT_DIR=target/release
# Whichever of the three binaries are there (.dockerignore lets in no other file): a
# worker host needs no script-runner-ctl, the api image does.
COPY ${PREBUILT_DIR}/script-runner-* /out/

FROM ${BINARIES} AS binaries

# --- api: non-root, nothing but the binaries and CA roots (rediss://). script-runner-ctl
# is here for docker-compose.yml's one-shot `functions` service (as Redis's admin) ------
FROM ${BASE_IMAGE} AS api
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin script-runner
COPY --from=binaries /out/script-runner-api /out/script-runner-ctl /usr/local/bin/
USER script-runner
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/script-runner-api"]

# --- worker: root, because it installs the task firewall (iptables, NET_ADMIN) and
# drives the Docker engine through its socket, which is root-equivalent anyway. redis-cli
# is there for deploy/add-worker.sh's connection checks and for watching live ----------
FROM ${BASE_IMAGE} AS worker
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates iptables iproute2 redis-tools \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY --from=binaries /out/script-runner-worker /usr/local/bin/script-runner-worker
COPY deploy/worker-entrypoint.sh /usr/local/bin/worker-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/worker-entrypoint.sh"]

# --- redis: Debian's redis-server, configured at start from the environment ----------
FROM ${BASE_IMAGE} AS redis
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && mkdir -p /data && chown redis:redis /data
COPY deploy/redis/entrypoint.sh /usr/local/bin/redis-entrypoint.sh
VOLUME /data
EXPOSE 6379 6380
ENTRYPOINT ["/usr/local/bin/redis-entrypoint.sh"]

# --- caddy: Debian's caddy (2.6), certificates kept in the /data volume --------------
FROM ${BASE_IMAGE} AS caddy
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends caddy ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && mkdir -p /data /config && chown caddy:caddy /data /config
ENV XDG_DATA_HOME=/data XDG_CONFIG_HOME=/config
COPY Caddyfile /etc/caddy/Caddyfile
USER caddy
EXPOSE 80 443
ENTRYPOINT ["caddy", "run", "--config", "/etc/caddy/Caddyfile", "--adapter", "caddyfile"]
