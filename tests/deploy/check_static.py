"""Static checks of the deploy path, for tests/deploy/test-deploy.sh (run from the repository
root, with Compose v2 as `docker compose`).

    check_static.py workflows   the deploy workflow deploys the commit its tests passed, in the
                                environment `production`; the weekly rebuild is scheduled and
                                rebuilds; no job outside that environment reads a secret
    check_static.py compose     `docker compose config` of every compose file: every service
                                has the hardening (docs/security.md#compose-hardening), no
                                password in Prometheus's environment, no CA key in Redis;
                                with deploy/redis-sentinel.yml, api, worker and functions
                                find Redis through the three sentinels

Exits 1 with one line per finding.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ruamel.yaml import YAML

ENVIRONMENT = "production"

# Service -> the capabilities it may add back after `cap_drop: [ALL]`, and whether its root
# must be read-only. docs/security.md's table says why; a change here is a change there.
HARDENING = {
    "api": (set(), True),
    "functions": (set(), True),
    "caddy": (set(), True),
    "redis": ({"CHOWN", "SETUID", "SETGID"}, True),
    # deploy/redis-sentinel.yml: the same image and entrypoint as redis.
    "redis-replica": ({"CHOWN", "SETUID", "SETGID"}, True),
    "sentinel-1": ({"CHOWN", "SETUID", "SETGID"}, True),
    "sentinel-2": ({"CHOWN", "SETUID", "SETGID"}, True),
    "sentinel-3": ({"CHOWN", "SETUID", "SETGID"}, True),
    "worker": ({"NET_ADMIN", "NET_RAW", "SYS_PTRACE", "CHOWN", "FOWNER", "DAC_OVERRIDE"}, False),
    "prometheus": (set(), False),
    "grafana": (set(), False),
}

problems: list[str] = []


def problem(text: str) -> None:
    problems.append(text)


def load(path: str) -> dict:
    # YAML 1.2 (ruamel): `on` stays a string, not True.
    return YAML(typ="safe").load(Path(path).read_text())


def env_of(step: dict, job: dict) -> dict:
    return {**(job.get("env") or {}), **(step.get("env") or {})}


def environment_name(job: dict) -> str | None:
    env = job.get("environment")
    return env.get("name") if isinstance(env, dict) else env


def ssh_commands(job: dict) -> list[tuple[str, dict]]:
    """(run script, its env) of every step that runs ssh."""
    return [
        (step["run"], env_of(step, job))
        for step in job.get("steps") or []
        if re.search(r"(^|\s)ssh\s", step.get("run", ""))
    ]


def check_secrets_only_in_environment(name: str, workflow: dict) -> None:
    for job_name, job in (workflow.get("jobs") or {}).items():
        if "secrets." in json.dumps(job) and environment_name(job) != ENVIRONMENT:
            problem(f"{name}: job {job_name} reads secrets outside the environment {ENVIRONMENT}")


def check_workflows() -> None:
    deploy = load(".github/workflows/deploy.yml")
    jobs = deploy.get("jobs") or {}
    on = deploy.get("on") or {}
    if (on.get("push") or {}).get("branches") != ["main"]:
        problem("deploy.yml: does not run on pushes to main")
    test_jobs = [n for n, j in jobs.items() if j.get("uses") == "./.github/workflows/test.yml"]
    if not test_jobs:
        problem("deploy.yml: no job runs ./.github/workflows/test.yml")
    deploy_jobs = [(n, j) for n, j in jobs.items() if ssh_commands(j)]
    if not deploy_jobs:
        problem("deploy.yml: no job deploys over ssh")
    for job_name, job in deploy_jobs:
        needs = job.get("needs") or []
        needs = [needs] if isinstance(needs, str) else needs
        if not set(test_jobs) <= set(needs) or not test_jobs:
            problem(f"deploy.yml: job {job_name} does not need the test job {test_jobs}")
        if environment_name(job) != ENVIRONMENT:
            problem(f"deploy.yml: job {job_name} does not use the environment {ENVIRONMENT}")
        for script, env in ssh_commands(job):
            # The remote command is `deploy $VAR`, VAR being ${{ github.sha }}: the commit
            # this run checked out and tested (never a branch name, never origin/main).
            sent = re.search(r'"deploy \$\{?([A-Z_]+)\}?"\s*$', script.strip())
            if not sent:
                problem(f"deploy.yml: job {job_name}'s ssh does not send 'deploy $COMMIT': {script!r}")
            elif env.get(sent.group(1), "").replace(" ", "") != "${{github.sha}}":
                problem(
                    f"deploy.yml: job {job_name} sends {sent.group(1)}="
                    f"{env.get(sent.group(1))!r}, not ${{{{ github.sha }}}}"
                )
    check_secrets_only_in_environment("deploy.yml", deploy)

    rebuild = load(".github/workflows/rebuild.yml")
    crons = [s.get("cron") for s in (rebuild.get("on") or {}).get("schedule") or []]
    if not crons or not all(crons):
        problem("rebuild.yml: no schedule")
    jobs = [(n, j) for n, j in (rebuild.get("jobs") or {}).items() if ssh_commands(j)]
    if not jobs:
        problem("rebuild.yml: no job rebuilds over ssh")
    for job_name, job in jobs:
        if environment_name(job) != ENVIRONMENT:
            problem(f"rebuild.yml: job {job_name} does not use the environment {ENVIRONMENT}")
        for script, _ in ssh_commands(job):
            if not re.search(r"\srebuild\s*$", script.strip()):
                problem(f"rebuild.yml: job {job_name}'s ssh does not send 'rebuild': {script!r}")
    # One deploy or rebuild at a time: each job that reaches the host is in one
    # concurrency group, never cancelled half done. The group is the jobs', not the
    # workflows': a rebuild waiting for its reviewer would otherwise hold every push's
    # tests as well.
    groups = set()
    for wf_name, wf, ssh_jobs in (("deploy.yml", deploy, deploy_jobs), ("rebuild.yml", rebuild, jobs)):
        if "concurrency" in wf:
            problem(f"{wf_name}: concurrency at the workflow level (it holds the tests too): put it on the job")
        for job_name, job in ssh_jobs:
            conc = job.get("concurrency")
            group = conc if isinstance(conc, str) else (conc or {}).get("group")
            if not group:
                problem(f"{wf_name}: job {job_name} has no concurrency group (it could overlap a deploy)")
            elif isinstance(conc, dict) and conc.get("cancel-in-progress") not in (None, False):
                problem(f"{wf_name}: job {job_name} may be cancelled half done (cancel-in-progress)")
            groups.add(group)
    if len(groups) != 1:
        problem(f"deploy.yml and rebuild.yml: their ssh jobs are not in one concurrency group: {sorted(map(str, groups))}")
    check_secrets_only_in_environment("rebuild.yml", rebuild)


def compose_config(env_file: str, *files: str, profile: str | None = None) -> dict:
    args = ["docker", "compose", "--env-file", env_file]
    for f in files:
        args += ["-f", f]
    if profile:
        args += ["--profile", profile]
    out = subprocess.run(args + ["config", "--format", "json"], capture_output=True, text=True)
    if out.returncode != 0:
        problem(f"docker compose {' '.join(files)} config failed: {out.stderr.strip()}")
        return {"services": {}}
    return json.loads(out.stdout)


def memory_limit(service: dict) -> int | None:
    limit = service.get("mem_limit")
    if limit is None:
        limit = (((service.get("deploy") or {}).get("resources") or {}).get("limits") or {}).get("memory")
    return int(limit) if limit is not None else None


def check_service(where: str, name: str, service: dict) -> None:
    if name not in HARDENING:
        problem(f"{where}: service {name} is not in check_static.py's HARDENING table")
        return
    allowed, read_only = HARDENING[name]
    if service.get("privileged"):
        problem(f"{where}: {name} is privileged")
    if [c.upper() for c in service.get("cap_drop") or []] != ["ALL"]:
        problem(f"{where}: {name} does not drop every capability (cap_drop: {service.get('cap_drop')})")
    extra = {c.upper().removeprefix("CAP_") for c in service.get("cap_add") or []} - allowed
    if extra:
        problem(f"{where}: {name} adds capabilities beyond {sorted(allowed)}: {sorted(extra)}")
    if "no-new-privileges:true" not in (service.get("security_opt") or []):
        problem(f"{where}: {name} lacks security_opt no-new-privileges:true")
    limit = memory_limit(service)
    if not limit:
        problem(f"{where}: {name} has no memory limit")
    if read_only and service.get("read_only") is not True:
        problem(f"{where}: {name}'s root file system is not read-only")


def check_sentinel_overlay(services: dict) -> None:
    """deploy/redis-sentinel.yml: every client of Redis goes through the three sentinels,
    and the host-network worker can resolve every name they may answer."""
    where = "docker-compose.yml + redis-sentinel.yml"
    for name in ("api", "worker", "functions"):
        env = (services.get(name) or {}).get("environment") or {}
        hosts = re.findall(r"@([^:,]+):26379", env.get("REDIS_SENTINELS") or "")
        if hosts != ["sentinel-1", "sentinel-2", "sentinel-3"]:
            problem(f"{where}: {name}'s REDIS_SENTINELS does not name the three sentinels: {hosts}")
        if not env.get("REDIS_SENTINEL_MASTER"):
            problem(f"{where}: {name} has no REDIS_SENTINEL_MASTER")
    names = {"redis", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"}
    extra = services.get("worker", {}).get("extra_hosts") or {}
    resolved = set(extra) if isinstance(extra, dict) else {h.split("=")[0].split(":")[0] for h in extra}
    if not names <= resolved:
        problem(f"{where}: the worker (host network) cannot resolve {sorted(names - resolved)}")
    for node in ("redis", "redis-replica"):
        env = (services.get(node) or {}).get("environment") or {}
        for var in ("REDIS_REPLICA_PASSWORD", "REDIS_SENTINEL_PASSWORD", "REDIS_ANNOUNCE_HOST"):
            if not env.get(var):
                problem(f"{where}: {node} has no {var}")


def check_compose() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # TLS material as make-redis-tls.sh leaves it, CA key included.
        tls = Path(tmp, "tls")
        tls.mkdir()
        for f in ("ca.crt", "ca.key", "redis.crt", "redis.key"):
            (tls / f).write_text("x")
        env_file = Path(tmp, "env")
        env_file.write_text(
            "SCRIPT_RUNNER_TOKEN=" + "t" * 64 + "\n"
            "METRICS_TOKEN=" + "m" * 64 + "\n"
            "TASK_SIGNING_KEY=AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n"
            "TASK_VERIFY_KEYS=iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w=\n"
            "REDIS_API_PASSWORD=password-api\nREDIS_WORKER_PASSWORD=password-worker\n"
            "REDIS_ADMIN_PASSWORD=password-admin\nREDIS_OPS_PASSWORD=password-ops\n"
            "GRAFANA_ADMIN_PASSWORD=password-grafana\nDOMAIN=mcp.example.test\n"
            "REDIS_REPLICA_PASSWORD=password-replica\nREDIS_SENTINEL_PASSWORD=password-sentinel\n"
            "REDIS_SENTINEL_CLIENT_PASSWORD=password-client\n"
            f"REDIS_TLS_DIR={tls}\n"
        )
        worker_env = Path(tmp, "worker.env")
        worker_env.write_text(
            "REDIS_URL=rediss://worker:password-worker@mcp.example.test:6380\n"
            f"REDIS_CA_FILE={tls}/ca.crt\nWORKER_NAME=w2\n"
            "TASK_VERIFY_KEYS=iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w=\n"
        )
        stacks = {
            "docker-compose.yml + remote-workers.yml + monitoring": compose_config(
                str(env_file),
                "docker-compose.yml",
                "deploy/remote-workers.yml",
                "deploy/grafana/docker-compose.monitoring.yml",
                profile="monitoring",
            ),
            "docker-compose.yml": compose_config(str(env_file), "docker-compose.yml"),
            "deploy/worker-host.yml": compose_config(str(worker_env), "deploy/worker-host.yml"),
            "docker-compose.yml + redis-sentinel.yml": compose_config(
                str(env_file), "docker-compose.yml", "deploy/redis-sentinel.yml"
            ),
        }
        sentinel_services = {"redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"}
        expected = {
            "docker-compose.yml + remote-workers.yml + monitoring": set(HARDENING) - sentinel_services,
            "docker-compose.yml": {"api", "caddy", "functions", "redis", "worker"},
            "deploy/worker-host.yml": {"worker"},
            "docker-compose.yml + redis-sentinel.yml": {"api", "caddy", "functions", "redis", "worker"}
            | sentinel_services,
        }
        for where, config in stacks.items():
            services = config.get("services") or {}
            if set(services) != expected[where]:
                problem(f"{where}: services {sorted(services)}, expected {sorted(expected[where])}")
            for name, service in services.items():
                check_service(where, name, service)
            seen = ", ".join(
                f"{n} (+{','.join(s.get('cap_add') or []) or 'none'}"
                f"{', ro' if s.get('read_only') else ''}, {(memory_limit(s) or 0) >> 20} MiB)"
                for n, s in sorted(services.items())
            )
            print(f"{where}: {seen}")

        check_sentinel_overlay(stacks["docker-compose.yml + redis-sentinel.yml"]["services"])

        full = stacks["docker-compose.yml + remote-workers.yml + monitoring"]["services"]
        prometheus_env = (full.get("prometheus") or {}).get("environment") or {}
        secrets = set()
        for line in env_file.read_text().splitlines():
            key, _, value = line.partition("=")
            if "PASSWORD" in key or key == "SCRIPT_RUNNER_TOKEN":
                secrets.add(value)
        leaked = [k for k, v in prometheus_env.items() if "PASSWORD" in k or v in secrets]
        if leaked:
            problem(f"prometheus's environment holds passwords or the admin token: {leaked}")
        if set(prometheus_env) != {"METRICS_TOKEN"}:
            problem(f"prometheus gets more than METRICS_TOKEN: {sorted(prometheus_env)}")
        # The spec signing key is the api's alone: no worker, Redis or Prometheus gets it.
        for where, stack in stacks.items():
            for name, service in (stack.get("services") or {}).items():
                env = service.get("environment") or {}
                if name != "api" and "TASK_SIGNING_KEY" in env:
                    problem(f"{where}: {name} gets TASK_SIGNING_KEY, which only the api may hold")
                if name == "worker" and not env.get("TASK_VERIFY_KEYS"):
                    problem(f"{where}: the worker gets no TASK_VERIFY_KEYS")
        # read_files: the api reads the worker's default workspace store, read-only.
        single = stacks["docker-compose.yml"]["services"]
        worker_tasks = ((single.get("worker") or {}).get("environment") or {}).get("TASKS_DIR") or ""
        api = single.get("api") or {}
        store = (api.get("environment") or {}).get("WORKSPACE_STORE") or ""
        if store != f"{worker_tasks}/workspace-store":
            problem(f"the api's WORKSPACE_STORE {store!r} is not the worker's default store under {worker_tasks!r}")
        mounts = [m for m in api.get("volumes") or [] if m.get("target") == store]
        if not mounts or not all(m.get("read_only") for m in mounts):
            problem(f"the api does not mount the workspace store {store!r} read-only: {api.get('volumes')}")
        ca_key = (tls / "ca.key").resolve()
        for name in ("redis",):
            for mount in (full.get(name) or {}).get("volumes") or []:
                source = mount.get("source") or ""
                if mount.get("type") != "bind":
                    continue
                src = Path(source).resolve()
                if src == ca_key or src in ca_key.parents:
                    problem(f"{name} mounts {source}, which holds the CA key {ca_key}")
        redis_files = sorted(
            m.get("target") for m in (full.get("redis") or {}).get("volumes") or [] if m.get("type") == "bind"
        )
        print(f"redis's bind mounts: {redis_files}; prometheus's environment: {sorted(prometheus_env)}")


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "workflows":
        check_workflows()
    elif what == "compose":
        check_compose()
    else:
        print(__doc__, file=sys.stderr)
        return 64
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("COMPOSE_PROJECT_NAME", "sr-static-check")
    sys.exit(main())
